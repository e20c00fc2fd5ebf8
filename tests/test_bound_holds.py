"""The bound on forgetting holds at every initialization: a bounded run ends with the divergence of U from the base
within 1.5 eps at D14's gamma = 0.1 as at the drafts' gamma = 10, whatever the learning rate (causalqwen.divergence's
projection); and every door that takes the bound's, the gate's or the regression weight's setting refuses a bad one
by name (a ValueError; on the command line one line, exit status 2, nothing written).

Oracles: the KL closed form in float64 NumPy on the laws of a separate copy of the starting model (never the bound's
own reference), and the unbounded run of the same settings.
"""

import copy
import json
import math
import os

import numpy as np
import pytest
import torch

from causalqwen import CausalQwenConfig, train
from causalqwen.app import cli
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.divergence import DivergenceBound
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.initialization import DRAFT_INIT
from causalqwen.training import TrainingConfig, set_trainable

INITS = {"calibrated": {}, "drafts": DRAFT_INIT}


def _laws64(model, batch):
    """``(loc_U, scale_U)`` of ``model`` on ``batch`` as float64 NumPy arrays, and the mask of real positions."""
    with torch.no_grad():
        out = model.eval().abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    return out.loc_U.double().numpy(), out.scale_U.double().numpy(), batch["attention_mask"].bool().numpy()


def _mean_divergence64(model, starting, batch) -> float:
    """The mean over real positions of the per-position sum of the Cauchy KL closed form, in float64."""
    lp, sp, mask = _laws64(model, batch)
    lq, sq, _ = _laws64(starting, batch)
    per_position = np.log(((sp + sq) ** 2 + (lp - lq) ** 2) / (4 * sp * sq)).sum(-1)
    return float(per_position[mask].mean())


def _held_out(tokenizer):
    return collate(TextDataset(synthetic_texts(32, seed=7), tokenizer, max_length=32).items, tokenizer.pad_token_id)


def _run(init: str, max_u_divergence, learning_rate=0.03, steps=40, preset="abduction"):
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0, **INITS[init])
    starting = copy.deepcopy(model)
    config = TrainingConfig(
        steps=steps,
        batch_size=8,
        learning_rate=learning_rate,
        preset=preset,
        log_every=steps,
        eval_every=10**6,
        save_every=10**6,
        seed=0,
        max_u_divergence=max_u_divergence,
    )
    history = train(model, TextDataset(synthetic_texts(64, seed=0), tokenizer, max_length=32), config, progress=False)
    return _mean_divergence64(model, starting, _held_out(tokenizer)), history


@pytest.mark.parametrize("init", INITS)
def test_a_bounded_run_ends_within_one_and_a_half_eps_at_either_initialization(init):
    """The failing run of the report (preset abduction, 40 steps, learning rate 0.03, eps = 0.05): unbounded it
    moves U far; bounded it ends within 1.5 eps on held-out texts, at D14's gamma as at the drafts'."""
    epsilon = 0.05
    free, _ = _run(init, None)
    held, history = _run(init, epsilon)
    assert free > 10 * epsilon
    assert held <= 1.5 * epsilon, (init, held)
    assert history[-1]["constraint/max_u_divergence"] == epsilon
    assert 0 <= history[-1]["constraint/projection"] <= 1


def test_the_projection_puts_the_steps_batch_within_the_bound_on_the_segment_to_the_base():
    """One large step, then `step`: the trained parameters are base + t (stepped - base) with the logged t < 1, and
    the divergence of the step's batch, computed from a separate copy of the base, is at most eps."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    starting = copy.deepcopy(model)
    set_trainable(model, "abduction")
    model.train()
    batch = collate(TextDataset(synthetic_texts(8, seed=1), tokenizer, max_length=32).items, tokenizer.pad_token_id)
    epsilon = 0.05
    bound = DivergenceBound(model, epsilon, "abduction")
    with bound.capturing_features():
        out = model(**batch)
    (out.loss + bound.penalty(out, batch)).backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=5.0).step()
    stepped = {name: p.detach().clone() for name, p in model.model.abduction.named_parameters()}
    assert _mean_divergence64(model, starting, batch) > 10 * epsilon  # the step alone leaves the bound far behind
    bound.step()
    t = bound.metrics()["constraint/projection"]
    assert 0 < t < 1
    assert _mean_divergence64(model, starting, batch) <= epsilon
    for name, parameter in model.model.abduction.named_parameters():
        base = dict(starting.model.abduction.named_parameters())[name].detach()
        torch.testing.assert_close(parameter.detach(), base + t * (stepped[name] - base), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("preset", ["causal", "all", "lora"])
def test_the_projection_holds_for_every_preset(preset):
    """The other base references (the model's own pass with base modules, a frozen copy of the backbone, the
    adapters disabled): after a large step and `step`, the batch is within the bound, measured on a separate copy."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    starting = copy.deepcopy(model)
    if preset == "lora":
        from causalqwen.integrations.lora import add_lora

        model = add_lora(model, rank=2, alpha=4)
    set_trainable(model, preset)
    model.train()
    batch = collate(TextDataset(synthetic_texts(8, seed=1), tokenizer, max_length=32).items, tokenizer.pad_token_id)
    epsilon = 0.05
    bound = DivergenceBound(model, epsilon, preset)
    with bound.capturing_features():
        out = model(**batch)
    (out.loss + bound.penalty(out, batch)).backward()
    torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    trained = model.get_base_model() if preset == "lora" else model
    assert _mean_divergence64(trained, starting, batch) > epsilon
    bound.step()
    assert bound.metrics()["constraint/projection"] < 1
    assert _mean_divergence64(trained, starting, batch) <= epsilon


def test_the_bounded_trainer_ends_within_one_and_a_half_eps(tmp_path):
    """`DivergenceBoundTrainer` at the failing settings, at D14's gamma: within 1.5 eps on held-out texts."""
    from functools import partial

    from transformers import TrainingArguments

    from causalqwen import DivergenceBoundTrainer

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    starting = copy.deepcopy(model)
    set_trainable(model, "abduction")
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=40,
        per_device_train_batch_size=8,
        learning_rate=0.03,
        logging_steps=40,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = DivergenceBoundTrainer(
        model=model,
        args=args,
        train_dataset=TextDataset(synthetic_texts(64, seed=0), tokenizer, max_length=32),
        data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id),
        max_u_divergence=0.05,
        preset="abduction",
    )
    trainer.train()
    assert _mean_divergence64(model, starting, _held_out(tokenizer)) <= 1.5 * 0.05


# ---------------------------------------------------------------------------------------------
# Bad settings, at every door
# ---------------------------------------------------------------------------------------------

BAD_EPSILONS = [0, 0.0, -0.1, -1, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value", BAD_EPSILONS)
def test_training_config_refuses_a_bound_that_is_not_a_positive_finite_number(value):
    with pytest.raises(ValueError, match="max_u_divergence must be a finite number > 0"):
        TrainingConfig(max_u_divergence=value)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_training_config_refuses_a_bad_dual_step(value):
    with pytest.raises(ValueError, match="divergence_dual_lr must be a finite number >= 0"):
        TrainingConfig(max_u_divergence=0.1, divergence_dual_lr=value)


@pytest.fixture(scope="module")
def tiny_model():
    return build_tiny_causal_lm(seed=0, init_seed=0).model


@pytest.mark.parametrize("value", BAD_EPSILONS)
def test_the_bound_and_the_bounded_trainer_refuse_a_bad_epsilon(value, tmp_path, tiny_model):
    from transformers import TrainingArguments

    from causalqwen import DivergenceBoundTrainer

    model = tiny_model
    with pytest.raises(ValueError, match="max_divergence must be a finite number > 0"):
        DivergenceBound(model, value, "abduction")
    args = TrainingArguments(output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="max_u_divergence must be a finite number > 0"):
        DivergenceBoundTrainer(model=model, args=args, max_u_divergence=value, preset="abduction")
    with pytest.raises(ValueError, match="divergence_dual_lr must be a finite number >= 0"):
        DivergenceBoundTrainer(model=model, args=args, max_u_divergence=0.1, divergence_dual_lr=-1.0)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("gate_alpha", -0.1, "gate_alpha must be a number in \\[0, 1\\]"),
        ("gate_alpha", 1.5, "gate_alpha must be a number in \\[0, 1\\]"),
        ("gate_alpha", math.nan, "gate_alpha must be finite"),
        ("gate_alpha", math.inf, "gate_alpha must be finite"),
        ("regression_weight", -0.5, "regression_weight must be a number in \\[0, "),
        ("regression_weight", math.nan, "regression_weight must be finite"),
        ("regression_weight", -math.inf, "regression_weight must be finite"),
    ],
)
def test_the_config_refuses_a_bad_gate_or_regression_weight_when_made_or_updated(field, value, match):
    with pytest.raises(ValueError, match=match):
        CausalQwenConfig(**{field: value})
    config = CausalQwenConfig()
    before = config.to_dict()
    with pytest.raises(ValueError, match=match):
        config.update({field: value})
    assert config.to_dict() == before  # a refused update leaves the config as it was
    config.update({field: 0.5})  # a good one is taken
    assert getattr(config, field) == 0.5


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_the_command_line_refuses_a_bad_bound_in_one_line_writing_nothing(value, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"a {i}"}) + "\n" for i in range(8)))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--base", "tiny", "--data", str(data), "--out", str(out), f"--max-u-divergence={value}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2
    assert len(err) == 1 and "max_u_divergence must be a finite number > 0" in err[0], err
    assert not os.path.exists(out)
