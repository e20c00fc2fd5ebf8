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

import math
import os
import re
from decimal import Decimal

import pytest
import torch
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager  # noqa: E402

from causalqwen.app.lm_eval_adapter import CausalQwenLM, cut_at_stop, main  # noqa: E402
from causalqwen.app.tiny import save_tiny_base
from causalqwen.likelihood import (  # noqa: E402
    keep_last,
    score_continuation,
    score_text,
    split_context,
)

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


# lm-eval's request conventions in the ``causalqwen`` model (causalqwen.app.lm_eval_adapter), checked
# against lm-eval's own ``hf`` model (HFLM) on the same requests wherever the two share a convention.
#
# Both read one tiny Qwen2 base (`causalqwen.app.tiny.save_tiny_base`, seed 0): HFLM as it is, the adapter converted
# on load. At initialization the converted model's class locations are Qwen's logits, so the
# ``traditional`` mode's greedy decoding is Qwen's greedy decoding: on a text without numbers the adapter in that
# mode and HFLM must write the same tokens, which makes HFLM an oracle for the generation conventions (length
# budget and its aliases, stop strings, request order). The rest (model_args, request types, errors) is checked
# against the behaviour a user expects: a ``ValueError``/``TypeError`` naming the argument, or the library function
# called directly.


os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


os.environ.setdefault("HF_HUB_OFFLINE", "1")


os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


GREEDY = {"until": [], "do_sample": False}


TEXTS = ["The price is", "Hello world, we", "A"]  # no numbers: Qwen's tokens and CausalQwen's are the same


def _task_requests(kind: str, arguments: list[tuple], task: str | None = None) -> list[Instance]:
    return [
        Instance(request_type=kind, doc={}, arguments=args, idx=0, metadata=(task, index, 1))
        for index, args in enumerate(arguments)
    ]


def _generate(model, context: str, **settings) -> str:
    (text,) = model.generate_until(_task_requests("generate_until", [(context, settings)]), disable_tqdm=True)
    return text


@pytest.fixture(scope="module")
def directories(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny Qwen2 base, its conversion saved as a CausalQwen directory, which loads without converting)."""
    base = Path(save_tiny_base(tmp_path_factory.mktemp("qwen2"), seed=0))
    converted = CausalQwenLM(pretrained=str(base))
    saved = tmp_path_factory.mktemp("causalqwen")
    converted.model.save_pretrained(saved)
    converted.tokenizer.save_pretrained(saved)
    return base, saved


@pytest.fixture(scope="module")
def hf(directories):
    return HFLM(pretrained=str(directories[0]), device="cpu", dtype="float32", batch_size=2)


@pytest.fixture(scope="module")
def standard(directories):
    return CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]}")


@pytest.fixture(scope="module")
def traditional(directories):
    return CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]},mode=traditional")


@pytest.fixture(scope="module")
def causal(directories):
    return CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]},mode=causal,seed=7")


def _written_resolution(literal: str) -> Decimal:
    """The resolution a plain decimal literal states: 1 for an integer, 10^-d for d digits after the point."""
    assert re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", literal), literal
    decimals = len(literal.split(".")[1]) if "." in literal else 0
    return Decimal(1).scaleb(-decimals)


def test_the_traditional_greedy_decoding_is_hfs_greedy_decoding(hf, traditional):
    """The oracle the next tests lean on: the same requests, the same text."""
    requests = [(text, {**GREEDY, "max_gen_toks": 6}) for text in TEXTS]
    expected = hf.generate_until(_task_requests("generate_until", requests), disable_tqdm=True)
    assert traditional.generate_until(_task_requests("generate_until", requests), disable_tqdm=True) == expected
    assert all(len(hf.tok_encode(text)) == 6 for text in expected)


def test_an_empty_rolling_document_scores_zero_as_in_hf(hf, standard):
    documents = [("",), ("It weighs 2.5 kg.",), ("",)]
    assert hf.loglikelihood_rolling(_task_requests("loglikelihood_rolling", documents), disable_tqdm=True)[0::2] == [
        0,
        0,
    ]
    scores = standard.loglikelihood_rolling(_task_requests("loglikelihood_rolling", documents), disable_tqdm=True)
    assert scores == [
        0.0,
        score_text(standard.model, standard.tokenizer, "It weighs 2.5 kg."),
        0.0,
    ]


@pytest.mark.parametrize("alias", ["max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens"])
def test_every_alias_of_the_generation_budget_is_honoured_as_in_hf(hf, traditional, standard, alias):
    expected = _generate(hf, "The price is", **GREEDY, **{alias: 3})
    assert len(hf.tok_encode(expected)) == 3
    assert _generate(traditional, "The price is", **GREEDY, **{alias: 3}) == expected
    ids, _ = standard.tokenizer.encode(_generate(standard, "The price is", **GREEDY, **{alias: 3}))
    assert len(ids) == 3  # the standard mode writes words here: each generated token reads back as one


def test_the_first_budget_by_lm_evals_priority_wins_as_in_hf(hf, traditional):
    settings = {**GREEDY, "max_new_tokens": 5, "max_gen_toks": 2}  # max_gen_toks > max_new_tokens
    expected = _generate(hf, "The price is", **settings)
    assert len(hf.tok_encode(expected)) == 2
    assert _generate(traditional, "The price is", **settings) == expected


def test_an_empty_stop_string_cuts_nothing(hf, traditional, standard):
    """lm-eval's post-processing skips an empty stop string, so hf's text is not cut to "" (its stopping
    criterion finds "" in any text and ends the generation after one token; the adapter does not copy that)."""
    whole = _generate(hf, "The price is", **GREEDY, max_gen_toks=4)
    with_empty = _generate(hf, "The price is", **{**GREEDY, "until": [""]}, max_gen_toks=4)
    assert with_empty != "" and whole.startswith(with_empty)
    assert _generate(traditional, "The price is", **{**GREEDY, "until": ["", "\n"]}, max_gen_toks=4) == whole
    assert _generate(traditional, "The price is", **{**GREEDY, "until": ""}, max_gen_toks=4) == whole
    assert (
        _generate(standard, "The price is", **{**GREEDY, "until": [""]}, max_gen_toks=4)
        == _generate(standard, "The price is", **GREEDY, max_gen_toks=4)
        != ""
    )
    assert cut_at_stop("2.5 kg. Next", ["", "."]) == "2.5 kg"


def test_results_come_back_in_request_order_as_in_hf(hf, traditional, causal):
    """hf sorts by length and groups by generation kwargs, then restores the order; the adapter answers one by one.
    Each result of a mixed call is that request's result alone, in both (the causal mode's greedy draws too)."""
    requests = [
        ("A", {**GREEDY, "max_gen_toks": 1}),
        ("Hello world, we", {**GREEDY, "max_gen_toks": 3}),
        ("The price is", {**GREEDY, "max_gen_toks": 1}),
        ("A", {**GREEDY, "max_gen_toks": 3}),
    ]
    for model in (hf, traditional, causal):
        alone = [_generate(model, context, **settings) for context, settings in requests]
        assert model.generate_until(_task_requests("generate_until", requests), disable_tqdm=True) == alone
        assert model.generate_until(_task_requests("generate_until", requests[::-1]), disable_tqdm=True) == alone[::-1]
    pairs = [("The price is", " is is"), ("A", " long continuation of words"), ("Hello world,", " we")]
    for model in (hf, traditional):
        alone = [
            model.loglikelihood(_task_requests("loglikelihood", [pair]), disable_tqdm=True)[0][0] for pair in pairs
        ]
        together = [
            score for score, _ in model.loglikelihood(_task_requests("loglikelihood", pairs), disable_tqdm=True)
        ]
        assert together == pytest.approx(alone, abs=1e-5)


def test_do_sample_false_gives_the_same_text_for_a_request_in_a_sampling_mode(causal, directories):
    request = ("The price is", {**GREEDY, "max_gen_toks": 5})
    texts = causal.generate_until(_task_requests("generate_until", [request] * 3), disable_tqdm=True)
    again = CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]},mode=causal,seed=7")
    assert texts == [_generate(again, request[0], **request[1])] * 3


def test_do_sample_true_draws_on_so_repeats_differ_and_the_run_repeats(causal, directories):
    request = ("The price is", {"until": [], "max_gen_toks": 5, "do_sample": True})
    fresh = CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]},mode=causal,seed=3")
    texts = fresh.generate_until(_task_requests("generate_until", [request] * 3), disable_tqdm=True)
    assert len(set(texts)) > 1
    again = CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]},mode=causal,seed=3")
    assert again.generate_until(_task_requests("generate_until", [request] * 3), disable_tqdm=True) == texts


def test_sampling_in_the_standard_mode_decides_as_greedy_and_warns_once_with_the_modes_named(standard):
    """A task's temperature > 0 (lm-eval: do_sample=True) under the default mode runs, deterministically, as with
    do_sample=False; one warning per model names the sampling modes."""
    sampled = ("The price is", {"until": [], "max_gen_toks": 3, "temperature": 0.7})
    greedy = ("The price is", {"until": [], "max_gen_toks": 3, "do_sample": False})
    with pytest.warns(UserWarning, match=r"do_sample=True.*mode='standard'.*causal") as caught:
        texts = standard.generate_until(_task_requests("generate_until", [sampled] * 2), disable_tqdm=True)
    assert len([w for w in caught if "do_sample=True" in str(w.message)]) <= 1
    assert texts == standard.generate_until(_task_requests("generate_until", [greedy] * 2), disable_tqdm=True)


def test_sampling_at_temperature_zero_in_the_traditional_mode_names_the_temperature(traditional):
    request = ("The price is", {"until": [], "max_gen_toks": 2, "do_sample": True, "temperature": 0.0})
    with pytest.raises(ValueError, match=r"request 0 \(generate_until.*temperature must be a finite number > 0"):
        traditional.generate_until(_task_requests("generate_until", [request]), disable_tqdm=True)


@pytest.mark.parametrize(
    "kind, arguments",
    [
        ("loglikelihood", [("The price is", " 2.5 dollars."), ("A", " b")]),
        ("loglikelihood_rolling", [("It weighs 2.5 kg.",), ("",)]),
        ("generate_until", [("The price is", {**GREEDY, "max_gen_toks": 2})] * 2),
    ],
)
def test_each_request_type_runs_under_a_progress_bar_unless_disabled(standard, capsys, kind, arguments):
    getattr(standard, kind)(_task_requests(kind, arguments))
    assert re.search(rf"Running {kind} requests: 100%.*2/2", capsys.readouterr().err)
    getattr(standard, kind)(_task_requests(kind, arguments), disable_tqdm=True)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "arguments, named",
    [
        ("seed=abc", r"seed must be an integer from 0 to 2\*\*32 - 1, got 'abc'"),
        ("seed=1.5", r"seed must be an integer from 0 to 2\*\*32 - 1, got 1.5"),
        ("seed=-1", r"seed must be an integer from 0 to 2\*\*32 - 1, got -1"),
        ("seed=4294967296", r"seed must be an integer from 0 to 2\*\*32 - 1, got 4294967296"),
        ("seed=true", r"seed must be an integer from 0 to 2\*\*32 - 1, got True"),
        ("seed=", r"seed must be an integer from 0 to 2\*\*32 - 1, got ''"),
        ("device=bogus", "device must be cpu, cuda or cuda:N, got 'bogus'"),
        ("device=mps", "device must be cpu, cuda or cuda:N, got 'mps'"),
        ("device=cuda:x", "device must be cpu, cuda or cuda:N, got 'cuda:x'"),
        ("device=", "device must be cpu, cuda or cuda:N, got ''"),
        ("mode=", "mode='': unknown inference mode ''"),
        ("mode=none", "mode=None: unknown inference mode None"),
        ("mode=Standard", "mode='Standard': unknown inference mode 'Standard'"),
        ("token_probability=", "token_probability='': token_probability must be"),
        ("number_resolution=0.3", "number_resolution=0.3: "),
        ("number_resolution=abc", "number_resolution='abc': "),
        ("number_resolution=true", "number_resolution=True: "),
        ("pretrained=", "pretrained must be a directory, a hub id or tiny"),
        ("pretrained=123", "pretrained must be a directory, a hub id or tiny .*got 123"),
        ("batch_size=abc", "batch_size must be a positive integer, auto or auto:N, got 'abc'"),
        ("batch_size=0", "batch_size must be a positive integer, auto or auto:N, got 0"),
        ("batch_size=auto:0", "batch_size must be a positive integer, auto or auto:N, got 'auto:0'"),
        ("max_batch_size=-1", "max_batch_size must be a positive integer, got -1"),
        ("dtype=bfloat16", "dtype must be float32 or auto .*got 'bfloat16'"),
        ("trust_remote_code=maybe", "trust_remote_code must be True or False, got 'maybe'"),
    ],
)
def test_a_bad_model_arg_is_a_value_error_naming_it_and_its_value(arguments, named):
    with pytest.raises(ValueError, match="model_args " + named):
        CausalQwenLM.create_from_arg_string(
            f"pretrained=tiny,{arguments}" if "pretrained" not in arguments else arguments
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_cuda_device_without_cuda_names_the_fix():
    with pytest.raises(ValueError, match="model_args device 'cuda:0' .*pass --device cpu"):
        CausalQwenLM.create_from_arg_string("pretrained=tiny", {"device": "cuda:0"})


def test_the_values_lm_evals_command_line_passes_are_accepted(directories):
    """What `lm_eval --batch_size 8 --device cpu` hands over (batch_size as a str), and the usual hf arguments."""
    model = CausalQwenLM.create_from_arg_string(
        f"pretrained={directories[1]},dtype=float32,trust_remote_code=True,seed=4294967295,max_batch_size=64",
        {"batch_size": "8", "device": "cpu"},
    )
    assert (model.seed, model.device) == (4294967295, torch.device("cpu"))
    for batch_size in ("auto", "auto:4", 16):
        CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]}", {"batch_size": batch_size})


def test_a_bfloat16_checkpoint_is_scored_in_float32_as_documented(directories, tmp_path):
    """docs/lm_eval.md: requests are scored in float32 (``dtype`` changes nothing). A bfloat16 CausalQwen directory is
    loaded in float32, so its loglikelihood is the float32 model's (scored directly with `causalqwen.likelihood` on
    the same weights cast by hand; the bfloat16 model's is more than 1e-3 nats away)."""
    from causalqwen.likelihood import score_continuation, split_context

    source = CausalQwenLM(pretrained=str(directories[1]))
    source.model.to(torch.bfloat16).save_pretrained(tmp_path)
    source.tokenizer.save_pretrained(tmp_path)
    for arguments in (f"pretrained={tmp_path}", f"pretrained={tmp_path},dtype=float32"):
        model = CausalQwenLM.create_from_arg_string(arguments)
        assert {parameter.dtype for parameter in model.model.parameters()} == {torch.float32}
    pieces = split_context(source.tokenizer, "The price is", " 12.5 yuan.")
    in_bfloat16 = score_continuation(source.model, *pieces).log_likelihood
    expected = score_continuation(source.model.float(), *pieces).log_likelihood  # each bf16 weight is a float32
    ((got, _),) = model.loglikelihood(
        _task_requests("loglikelihood", [("The price is", " 12.5 yuan.")]), disable_tqdm=True
    )
    assert got == pytest.approx(expected, rel=1e-7, abs=0)
    assert abs(in_bfloat16 - expected) > 1e-3, (in_bfloat16, expected)


@pytest.mark.parametrize(
    "kind, arguments, error, message",
    [
        (
            "loglikelihood",
            (5, " x"),
            TypeError,
            r"request 1 \(loglikelihood, task t, doc 1\): context must be a str, got int",
        ),
        ("loglikelihood", ("a", None), TypeError, "continuation must be a str, got NoneType"),
        (
            "loglikelihood",
            ("a", "b", "c"),
            ValueError,
            r"loglikelihood takes \(context, continuation\), got 3 arguments",
        ),
        ("loglikelihood", ("It costs 2", ".5 dollars"), ValueError, r"request 1 \(loglikelihood.*splits the number"),
        ("loglikelihood", ("The price", ""), ValueError, r"request 1 \(loglikelihood.*continuation is empty"),
        (
            "loglikelihood_rolling",
            (b"bytes",),
            TypeError,
            r"request 1 \(loglikelihood_rolling.*text must be a str, got bytes",
        ),
        (
            "generate_until",
            ("Hi", ["\n"]),
            TypeError,
            r"request 1 \(generate_until.*gen_kwargs must be a dict, got list",
        ),
        (
            "generate_until",
            ("Hi", {"until": [5]}),
            TypeError,
            r"request 1 \(generate_until.*until must be a str or a list",
        ),
        (
            "generate_until",
            ("Hi", {"max_new_tokens": "abc"}),
            ValueError,
            r"request 1 \(generate_until.*generation_kwargs",
        ),
        ("generate_until", ("Hi", {"max_gen_toks": 0}), ValueError, "max_gen_toks must be at least 1, got 0"),
        ("generate_until", ("Hi", {"max_tokens": 5000}), ValueError, r"request 1 \(generate_until.*max_gen_toks=5000"),
        ("generate_until", ("Hi", {"do_sample": "no"}), TypeError, "do_sample must be True or False, got 'no'"),
        (
            "generate_until",
            ("Hi", {"num_beams": 4}),
            ValueError,
            r"\['num_beams'\] are not read by the causalqwen model",
        ),
    ],
)
def test_a_bad_request_is_named_by_its_position_type_task_and_document(standard, kind, arguments, error, message):
    fine = {
        "loglikelihood": ("a", " b"),
        "loglikelihood_rolling": ("a b",),
        "generate_until": ("a", {**GREEDY, "max_gen_toks": 1}),
    }[kind]
    with pytest.raises(error, match=message):
        getattr(standard, kind)(_task_requests(kind, [fine, arguments], task="t"), disable_tqdm=True)


def test_a_plain_tuple_is_not_a_request(standard):
    with pytest.raises(TypeError, match=r"request 0 \(loglikelihood\): loglikelihood takes lm-eval Instances"):
        standard.loglikelihood([("a", " b")], disable_tqdm=True)


def test_a_context_of_whitespace_is_scored_and_continued(standard):
    ((log_likelihood, greedy),) = standard.loglikelihood(
        _task_requests("loglikelihood", [("   ", " price")]), disable_tqdm=True
    )
    expected = score_continuation(standard.model, *split_context(standard.tokenizer, "   ", " price"))
    assert (log_likelihood, greedy) == (expected.log_likelihood, expected.is_greedy) and math.isfinite(log_likelihood)
    (rolling,) = standard.loglikelihood_rolling(
        _task_requests("loglikelihood_rolling", [(" \n\t ",)]), disable_tqdm=True
    )
    assert rolling == score_text(standard.model, standard.tokenizer, " \n\t ") and math.isfinite(rolling)
    assert isinstance(_generate(standard, " \n ", **GREEDY, max_gen_toks=2), str)


@pytest.mark.parametrize(
    "continuation",
    [
        " 1e400 dollars",
        " 1e-400 m",
        " 1e30 dollars",
        " 123456789012345678901234567890.5 dollars",
        " 0." + "0" * 40 + "1 m",
    ],
)
def test_numbers_of_any_size_reach_the_likelihood_and_its_answer_or_error_comes_back_named(standard, continuation):
    """The adapter adds nothing of its own: the result is the likelihood's, or the likelihood's error with the
    request named."""
    try:
        encoded = keep_last(
            *split_context(standard.tokenizer, "It costs", continuation),
            standard.model.config.max_position_embeddings,
            standard.tokenizer.num_token_id,
        )
        expected = score_continuation(standard.model, *encoded)
    except (ValueError, TypeError, ArithmeticError) as error:
        with pytest.raises(type(error)) as raised:
            standard.loglikelihood(_task_requests("loglikelihood", [("It costs", continuation)]), disable_tqdm=True)
        assert str(raised.value) == f"request 0 (loglikelihood, doc 0): {error}"
        return
    ((log_likelihood, greedy),) = standard.loglikelihood(
        _task_requests("loglikelihood", [("It costs", continuation)]), disable_tqdm=True
    )
    assert (log_likelihood, greedy) == (expected.log_likelihood, expected.is_greedy)


@pytest.mark.parametrize(
    "context, prompt_resolution, value",
    [
        ("It is 3e5 m away, about", Decimal("1e5"), 2.5),
        ("It is 3e5 m away, about", Decimal("1e5"), 12345.6),
        ("It costs 100 dollars, or", Decimal(1), 0.000123),
        ("It weighs 0.125 kg, or", Decimal("0.001"), 2.5),
        ("The price is", None, 2.4996202),  # no number in the context: the unit, keeping two significant digits
        ("In the year", None, 2026.3),
    ],
)
def test_a_generated_value_is_never_written_as_a_number_that_loses_it(directories, context, prompt_resolution, value):
    """Under number_resolution="prompt" a generated v is written at h = min(h_prompt, 10^(floor(log10|v|) - 1)),
    h_prompt the unit when the context holds no number: never fewer than two significant digits, whatever the
    context."""
    model = CausalQwenLM.create_from_arg_string(f"pretrained={directories[1]}")
    with torch.no_grad():  # every step predicts <NUM> with loc_Y = value
        model.model.action.classification_head.bias[model.tokenizer.num_token_id] = 1e4
        model.model.action.regression_head.weight.zero_()
        model.model.action.regression_head.bias.fill_(value)
    generated = Decimal(float(torch.tensor(value, dtype=torch.float32)))  # the float32 value the model carries
    two_digits = Decimal(1).scaleb(generated.adjusted() - 1)  # adjusted(): floor(log10 |v|), exact
    expected_resolution = min(Decimal(1) if prompt_resolution is None else prompt_resolution, two_digits)
    written = _generate(model, context, **GREEDY, max_gen_toks=1).strip()
    # the text's digits go down to the resolution (an integer at 10^3 ends in zeros: "12000" states the unit)
    assert _written_resolution(written) == min(expected_resolution, Decimal(1))
    assert Decimal(written) % expected_resolution == 0
    assert abs(Decimal(written) - generated) <= expected_resolution / 2
