"""The lm-eval adapter (causalqwen.app.lm_eval_adapter): lm-eval's own client runs CausalQwen on the
offline task set under validation/lm_eval_tasks, with all three request types, and its answers are the
project's likelihood and generation.

The expected log-likelihoods come from `causalqwen.likelihood` called directly (tested against its own oracles in
tests/test_likelihood.py); lm-eval's side (requests, filters, metrics) is lm-eval's code, not a stand-in.
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from causalqwen.app.lm_eval_adapter import CausalQwenLM, cut_at_stop, main  # noqa: E402
from causalqwen.likelihood import score_continuation, score_text, split_context  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASKS = str(ROOT / "validation" / "lm_eval_tasks")


@pytest.fixture(scope="module")
def lm():
    return CausalQwenLM.create_from_arg_string("pretrained=tiny,mode=standard")


def _requests(kind: str, arguments: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=args, idx=index) for index, args in enumerate(arguments)]


def test_loglikelihood_requests_are_the_likelihood_of_the_package(lm):
    pairs = [("A cup of coffee costs", " 2.5 dollars."), ("The code 37 repeated is", " 73.")]
    results = lm.loglikelihood(_requests("loglikelihood", pairs))
    for (context, continuation), (log_likelihood, greedy) in zip(pairs, results):
        expected = score_continuation(lm.model, *split_context(lm.tokenizer, context, continuation))
        assert (log_likelihood, greedy) == (expected.log_likelihood, expected.is_greedy)


def test_rolling_requests_score_every_token(lm):
    (result,) = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [("It weighs 2.5 kg.",)]))
    assert result == score_text(lm.model, lm.tokenizer, "It weighs 2.5 kg.")


def test_generate_until_writes_numbers_and_stops_outside_them(lm):
    (text,) = lm.generate_until(
        _requests("generate_until", [("A bag of rice weighs", {"until": ["\n"], "max_gen_toks": 6})])
    )
    assert isinstance(text, str) and "\n" not in text and "<NUM>" not in text


@pytest.mark.parametrize(
    "text, until, expected",
    [
        ("2.5 kg. Next", ["."], "2.5 kg"),
        ("It is 3.75", ["."], "It is 3.75"),
        ("1,000 and 2", [","], "1,000 and 2"),
        ("a\nb", ["\n"], "a"),
        ("no stop", ["."], "no stop"),
        ("x. 2.5", [".", "\n"], "x"),
    ],
)
def test_stop_strings_never_cut_a_number(text, until, expected):
    assert cut_at_stop(text, until) == expected


def test_lm_evals_client_runs_the_offline_task_set_with_all_three_request_types(lm):
    results = lm_eval.simple_evaluate(model=lm, tasks=["cq_numbers"], task_manager=TaskManager(include_path=TASKS))
    metrics = results["results"]
    assert 0.0 <= metrics["cq_numbers_mc"]["acc,none"] <= 1.0
    assert metrics["cq_numbers_rolling"]["bits_per_byte,none"] > 0
    assert 0.0 <= metrics["cq_numbers_gen"]["exact_match,first_number"] <= 1.0


@pytest.mark.parametrize(
    "arguments, match",
    [
        ("pretrained=tiny,mode=greedy", "mode"),
        ("pretrained=tiny,number_resolution=0.3", "number_resolution"),
        ("pretrained=tiny,token_probability=argmax", "token_probability"),
        ("pretrained=tiny,temprature=2", "unknown"),
        ("pretrained=model_nope", "model_nope"),
    ],
)
def test_bad_model_args_are_named(arguments, match):
    with pytest.raises(ValueError, match=match):
        CausalQwenLM.create_from_arg_string(arguments)


def test_a_split_number_is_refused_not_scored(lm):
    with pytest.raises(ValueError, match="splits the number"):
        lm.loglikelihood(_requests("loglikelihood", [("It costs 2", ".5 dollars")]))


def test_the_command_line_runs_lm_evals_cli_with_the_model_registered(tmp_path, capsys):
    main(
        [
            "--model",
            "causalqwen",
            "--model_args",
            "pretrained=tiny",
            "--tasks",
            "cq_numbers_mc",
            "--include_path",
            TASKS,
            "--limit",
            "2",
            "--device",
            "cpu",
            "--output_path",
            str(tmp_path),
        ]
    )
    assert "cq_numbers_mc" in capsys.readouterr().out


def test_generate_until_takes_an_empty_context_and_refuses_a_budget_beyond_the_positions(lm):
    (text,) = lm.generate_until(_requests("generate_until", [("", {"until": ["\n"], "max_gen_toks": 3})]))
    assert isinstance(text, str)
    with pytest.raises(ValueError, match="max_gen_toks=5000"):
        lm.generate_until(_requests("generate_until", [("Hi", {"until": ["\n"], "max_gen_toks": 5000})]))


def test_a_context_longer_than_the_positions_is_cut_on_the_left(lm):
    context = "The price was 2.5 dollars. " * 300  # about 2,700 tokens: more than the 2,048 positions
    ((log_likelihood, _),) = lm.loglikelihood(_requests("loglikelihood", [(context, "The end.")]))
    assert log_likelihood < 0


def test_lm_evals_own_models_stay_registered_beside_causalqwen():
    from lm_eval.api.registry import get_model

    assert get_model("causalqwen") is CausalQwenLM
    assert get_model("hf").__name__ == "HFLM"


def test_the_trap_as_typed_stops_with_a_message_that_names_the_adapter(tmp_path, lm):
    """`--model hf` on a CausalQwen directory with its own tokenizer: the tokenizer refuses transformers' encode
    keyword (its callers expect ids alone, which would lose every number) and names `--model causalqwen`."""
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(TypeError, match="--model causalqwen"):
        lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={tmp_path},trust_remote_code=True,dtype=float32",
            tasks=["cq_numbers_mc"],
            task_manager=TaskManager(include_path=TASKS),
            limit=1,
            device="cpu",
        )
