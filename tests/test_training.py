"""The training loop: presets, optimizer groups and schedule, one step against the loop written out by hand, the
logged metrics against independent recomputations, checkpoints written atomically, bit-exact resume, output rules."""

import json
import math
import os
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file
from tiny_runs import FOUR_STEP_RUN, TWO_STEP_RUN, tiny_data, tiny_model

from causalqwen import CausalQwenForCausalLM, NumericTokenizer, train
from causalqwen.app import cli, runs
from causalqwen.app.runs import latest_checkpoint
from causalqwen.app.tiny import build_tiny_base
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.files.rundir import (
    RunDirectory,
    remove_run_output,
)
from causalqwen.losses import ovr_probability
from causalqwen.metrics import evaluate_batch, training_metrics, with_log_prefixes
from causalqwen.training import (
    DEFAULT_WARMUP_RATIO,
    TrainingConfig,
    TrainingDiverged,
    loss_and_gradients,
    optimizer_and_schedule,
    parameter_groups,
    set_trainable,
    warmup_cosine_factor,
    warmup_cosine_schedule,
)


def synthetic_data(tokenizer, n=48, seed=0):
    """``n`` synthetic texts (seeded), tokenized to at most 32 tokens."""
    return TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=32)


CONFIG = dict(
    steps=6,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=2,
    preset="all",
    eval_every=3,
    save_every=3,
    log_every=1,
    seed=0,
)


def test_presets_choose_the_trainable_parameters(tokenizer):
    model = tiny_model()
    causal = set_trainable(model, "causal")
    new_modules = (
        "model.numerical_embedding.",
        "model.abduction.",
        "action.",
    )  # the Qwen2 stack is the rest of model.*
    assert causal and all(n.startswith(new_modules) for n in causal)
    assert "action.b_noise" in causal and "model.numerical_embedding.w_num" in causal
    assert not any(p.requires_grad for n, p in model.named_parameters() if not n.startswith(new_modules))
    assert set(set_trainable(model, "abduction")) == {
        n for n, _ in model.named_parameters() if n.startswith("model.abduction.")
    }
    assert len(set_trainable(model, "all")) == len(list(model.parameters()))
    learnable = tiny_model(learnable_threshold=True)
    assert "action.ovr_threshold" in set_trainable(learnable, "causal")  # the head owns the threshold
    with pytest.raises(ValueError, match="unknown preset 'everything'; choose one of causal, abduction, all"):
        set_trainable(model, "everything")
    with pytest.raises(ValueError, match="unknown preset"):
        TrainingConfig(preset="everything")


def test_weight_decay_applies_to_matrices_only(tokenizer):
    model = tiny_model()
    set_trainable(model, "causal")
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert any(p is model.action.b_noise for p in no_decay["params"])
    assert any(p is model.numerical_embedding.w_num for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == sum(p.requires_grad for p in model.parameters())


def test_the_schedule_is_linear_warm_up_then_cosine_decay_to_zero(tokenizer):
    """lr_t = lr t / w for t < w, then lr (1 + cos(pi (t - w) / (T - w))) / 2: written out, step by step."""
    config = TrainingConfig(**CONFIG | {"steps": 7, "warmup_steps": 3, "learning_rate": 0.25})
    optimizer, scheduler = optimizer_and_schedule(tiny_model(), config)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [config.weight_decay, 0.0]
    rates = []
    for _ in range(config.steps + 1):
        rates.append(optimizer.param_groups[0]["lr"])
        assert scheduler.get_last_lr() == [rates[-1]] * 2
        optimizer.step()
        scheduler.step()
    expected = [0.25 * t / 3 for t in range(3)] + [
        0.25 * (1 + math.cos(math.pi * (t - 3) / 4)) / 2 for t in range(3, 8)
    ]
    assert rates == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert rates[-1] == 0.0


def test_training_metrics_are_the_step_s_losses_and_the_ovr_argmax_accuracy(tokenizer):
    model = tiny_model()
    batch = collate(synthetic_data(tokenizer, 6, seed=3).items, tokenizer.pad_token_id)
    with torch.no_grad():
        out = model(**batch)
        full = model(**batch, return_decisions=True)  # the [B, S, V] decisions the metrics never form
    metrics = training_metrics(model, out)
    probability = ovr_probability(full.loc_S, full.scale_S, model.action.ovr_threshold)  # [B, S, V]
    scored = batch["attention_mask"][:, :-1].bool() & batch["attention_mask"][:, 1:].bool()  # [B, S - 1]
    hits = (probability[:, :-1].argmax(-1) == batch["labels"][:, 1:])[scored]
    noise = np.abs(model.action.b_noise.detach().double().numpy())  # |b_noise| [C]
    scale_U = out.scale_U[:, :-1][scored].double().numpy()  # [N, C] at the scored positions
    assert metrics == {
        "train/total_loss": out.loss.item(),
        "train/cls_loss_mean": out.cls_loss.item(),
        "train/reg_loss_effective": out.reg_loss.item(),
        "train/accuracy": hits.sum().item() / hits.numel(),
        "train/noise_scale_mean": pytest.approx(noise.mean(), rel=1e-12),
        "train/noise_scale_median": pytest.approx(np.median(noise), rel=1e-12),
        "train/noise_scale_over_U_scale": pytest.approx(np.median(noise) / np.median(scale_U), rel=1e-12),
    }


def test_two_steps_are_the_loop_written_out_by_hand(tokenizer):
    """train's steps against the reference loop: the batches of DistributedSampler's permutation for (seed, epoch 0),
    the model's loss, backward, clipping at max_grad_norm, AdamW with decay on matrices only, the learning rate of
    the schedule (no warm-up, 2 steps: lr, lr / 2, then 0). Parameters, losses and norms equal bit for bit."""
    config = TrainingConfig(**CONFIG | {"steps": 2, "warmup_steps": 0, "eval_every": 100, "max_grad_norm": 0.5})
    data = synthetic_data(tokenizer)
    trained = tiny_model()
    history = train(trained, data, config, progress=False)

    model = tiny_model()
    set_trainable(model, "all")
    model.train()
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": config.weight_decay}, {"params": others, "weight_decay": 0.0}],
        lr=config.learning_rate,
    )
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(config.seed)).tolist()
    for step, factor, next_factor in ((0, 1.0, 0.5), (1, 0.5, 0.0)):
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * factor
        batch = collate([data[i] for i in order[4 * step : 4 * step + 4]], tokenizer.pad_token_id)
        out = model(**batch)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record = history[step]
        assert record["step"] == step + 1 and record["train/total_loss"] == out.loss.item()
        assert (
            record["train/grad_norm"] == float(norm)
            and record["train/learning_rate"] == config.learning_rate * next_factor
        )
    for (name, a), (_, b) in zip(trained.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name
    assert not trained.training  # returned in eval mode


def test_loss_and_gradients_clips_and_stops_before_a_non_finite_update(tokenizer):
    model = tiny_model()
    set_trainable(model, "causal")
    config = TrainingConfig(**CONFIG | {"max_grad_norm": 1e-3})
    batch = collate(synthetic_data(tokenizer, 4).items, tokenizer.pad_token_id)
    out, norm = loss_and_gradients(model, model, batch, config)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert float(norm) > 1e-3 and clipped.item() == pytest.approx(1e-3, rel=1e-4)  # norm before, max_grad_norm after
    assert not any(p.grad is not None for p in model.parameters() if not p.requires_grad)
    reference = tiny_model()(**batch)
    assert torch.equal(out.loss, reference.loss)
    with torch.no_grad():
        model.action.b_noise.fill_(float("nan"))
    model.zero_grad()
    with pytest.raises(
        TrainingDiverged,
        match=r"training diverged at step 5: loss = nan, gradient norm = nan; lower "
        r"the learning rate \(now 0.003\); the parameters are those after step 4",
    ):
        loss_and_gradients(model, model, batch, config, step=4, first=False)


def test_training_lowers_the_loss_and_writes_a_complete_run(tokenizer, tmp_path):
    model = tiny_model()
    eval_batch = collate(synthetic_data(tokenizer, 8, seed=9).items, tokenizer.pad_token_id)
    history = train(
        model,
        synthetic_data(tokenizer),
        TrainingConfig(**CONFIG | {"steps": 12}),
        eval_batch,
        str(tmp_path),
        progress=False,
    )
    losses = [r["train/total_loss"] for r in history]
    assert sum(losses[-3:]) < sum(losses[:3])
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 13))
    assert "eval/num_f1" in lines[2] and "dist/ovr_prob_sum_median_causal" in lines[2] and "eval/num_f1" not in lines[1]
    generator = torch.Generator().manual_seed(CONFIG["seed"])  # the eval draws: 3 evaluations before step 12's
    for _ in range(3):
        evaluate_batch(model, eval_batch, generator=generator)
    final = with_log_prefixes(evaluate_batch(model, eval_batch, generator=generator))
    assert {key: history[-1][key] for key in final} == final
    assert history == [{key: value for key, value in line.items()} for line in lines]  # the log is the history
    assert latest_checkpoint(str(tmp_path)).endswith("checkpoint-12")
    for step in (3, 6, 9, 12):
        files = set(os.listdir(tmp_path / f"checkpoint-{step}"))
        assert files == {
            "config.json",
            "model.safetensors",
            "training_state.safetensors",
            "trainer_state.json",
            "history.json",
            "causalqwen_auto.py",
            "generation_config.json",
            "checkpoint_files.json",
        }  # no pickle anywhere
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]
    reloaded = CausalQwenForCausalLM.from_pretrained(tmp_path / "checkpoint-12")
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_resume_after_an_interruption_is_bit_exact(tokenizer, tmp_path, killed_after_first_save):
    """Kill the run right after its step-3 checkpoint; resuming ends with the uninterrupted run's parameters."""
    eval_batch = collate(synthetic_data(tokenizer, 8, seed=9).items, tokenizer.pad_token_id)
    config = TrainingConfig(**CONFIG | {"steps": 7, "batch_size": 5})  # 48 // 5 = 9 batches: step 3 is mid-epoch
    uninterrupted = tiny_model()
    full_history = train(
        uninterrupted, synthetic_data(tokenizer), config, eval_batch, str(tmp_path / "a"), progress=False
    )

    with killed_after_first_save():
        train(tiny_model(), synthetic_data(tokenizer), config, eval_batch, str(tmp_path / "b"), progress=False)
    assert [name for name in os.listdir(tmp_path / "b") if name.startswith("checkpoint-")] == ["checkpoint-3"]
    resumed = tiny_model()  # a fresh process would rebuild the model the same way
    history = train(
        resumed, synthetic_data(tokenizer), config, eval_batch, str(tmp_path / "b"), resume=True, progress=False
    )

    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert history == full_history
    log = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert log == list(range(1, 8))
    for step in (6, 7):  # the optimizer's moments and the RNG states that drive the run, bit for bit
        a, b = (load_file(tmp_path / run / f"checkpoint-{step}" / "training_state.safetensors") for run in "ab")
        # rng.torch differs: each DataLoader iterator draws its base seed from torch's generator, and the resumed
        # run starts its iterator at step 3, not at step 0 (nothing in the run draws from that generator).
        assert a.keys() == b.keys() and [key for key in a if not torch.equal(a[key], b[key])] == ["rng.torch"], step
        a, b = (json.loads((tmp_path / run / f"checkpoint-{step}" / "trainer_state.json").read_text()) for run in "ab")
        assert a == b


def test_output_directory_rules(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 3})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for overwrite in (False, True):  # a directory no run wrote is never used, let alone emptied
        with pytest.raises(
            ValueError, match="exists and is not a causalqwen run .*never deletes files it did not write"
        ):
            train(
                tiny_model(),
                synthetic_data(tokenizer),
                config,
                out_dir=str(foreign),
                overwrite=overwrite,
                progress=False,
            )
        assert os.listdir(foreign) == ["notes.txt"]  # nothing written, nothing deleted
    run = tmp_path / "run"
    train(tiny_model(), synthetic_data(tokenizer), config, out_dir=str(run), progress=False)
    with pytest.raises(ValueError, match="holds a previous train run; pass resume to continue it or overwrite"):
        train(tiny_model(), synthetic_data(tokenizer), config, out_dir=str(run), progress=False)
    (run / "train.jsonl").write_text("the user's data, kept in the run directory")
    train(tiny_model(), synthetic_data(tokenizer), config, out_dir=str(run), overwrite=True, progress=False)
    assert (run / "train.jsonl").read_text().startswith("the user's data")
    assert {"causalqwen-run.json", "training_config.json", "metrics.jsonl", "checkpoint-3", "train.jsonl"} <= set(
        os.listdir(run)
    )


def test_resume_refuses_a_checkpoint_of_another_model_config(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 3})
    train(tiny_model(), synthetic_data(tokenizer), config, out_dir=str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="its model config differs in ovr_threshold"):
        train(
            tiny_model(ovr_threshold=50.0),
            synthetic_data(tokenizer),
            TrainingConfig(**CONFIG | {"steps": 5}),
            out_dir=str(tmp_path),
            resume=True,
            progress=False,
        )


def test_resume_from_a_truncated_checkpoint_names_the_file(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 3})
    train(tiny_model(), synthetic_data(tokenizer), config, out_dir=str(tmp_path), progress=False)
    (checkpoint,) = [d for d in os.listdir(tmp_path) if d.startswith("checkpoint-")]
    weights = tmp_path / checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(OSError, match=r"cannot resume from .*model\.safetensors.* cannot be read"):
        train(
            tiny_model(),
            synthetic_data(tokenizer),
            TrainingConfig(**CONFIG | {"steps": 5}),
            out_dir=str(tmp_path),
            resume=True,
            progress=False,
            allow_changed_settings=True,
        )


def test_bad_training_configs_and_datasets(tokenizer):
    for field, value, message in [
        ("steps", 0, "steps must be a positive int, got 0"),
        ("batch_size", -1, "batch_size must be a positive int, got -1"),
        ("warmup_steps", -1, "warmup_steps must be an int >= 0, got -1"),
        ("learning_rate", 0.0, "learning_rate must be a finite number > 0, got 0.0"),
        ("report_to", "mlflow", 'report_to must be "tensorboard", "wandb" or None, got \'mlflow\''),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            TrainingConfig(**{field: value})
    with pytest.raises(TypeError, match="^config must be a TrainingConfig, got dict$"):
        train(tiny_model(), synthetic_data(tokenizer, 10), dict(CONFIG), progress=False)
    with pytest.raises(ValueError, match="too few for one batch of 64"):
        train(
            tiny_model(), synthetic_data(tokenizer, 10), TrainingConfig(**CONFIG | {"batch_size": 64}), progress=False
        )


@pytest.mark.parametrize("sink, package", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_report_to_needs_its_package_and_is_never_required(tokenizer, tmp_path, sink, package):
    import importlib.util

    config = TrainingConfig(**CONFIG | {"steps": 1, "report_to": sink})
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here; the error path cannot be exercised")
    with pytest.raises(ValueError, match=f"report_to='{sink}' needs the {package} package"):
        train(tiny_model(), synthetic_data(tokenizer), config, out_dir=str(tmp_path / "run"), progress=False)


def test_the_progress_bar_never_shows_a_nan_loss_at_eval_only_steps(tokenizer, capsys):
    """An eval step that is not a log step has no training loss: the bar keeps the last one (it showed nan)."""
    eval_batch = collate(synthetic_data(tokenizer, n=4, seed=1).items, tokenizer.pad_token_id)
    config = TrainingConfig(**CONFIG | {"steps": 4, "log_every": 4, "eval_every": 1})
    train(tiny_model(), synthetic_data(tokenizer), config, eval_batch=eval_batch, progress=True)
    bar = capsys.readouterr().err
    assert "training" in bar and "loss=" in bar and "nan" not in bar


# ---------------------------------------------------------------------------------------------
# Short runs: the warm-up is a fraction of the run, the newest checkpoints are kept, evals are printed
# ---------------------------------------------------------------------------------------------


# A ratio as a user writes it: a decimal in [0, 1] of at most 15 significant digits (float64 keeps every such
# decimal, so its repr gives it back), in positional or exponent form.
ratio_text = st.one_of(
    st.builds(lambda digits: "0." + digits, st.text("0123456789", min_size=1, max_size=15)),
    st.builds(lambda mantissa, exponent: f"{mantissa}e-{exponent}", st.integers(1, 9), st.integers(1, 12)),
    st.sampled_from(["0", "1", "1.0", "0.07", "0.1", "0.3", "0.57", "0.29"]),
)


@given(ratio_text, st.integers(1, 2**63 - 1))
def test_the_warm_up_of_a_ratio_is_the_exact_ceiling_of_the_ratio_as_written_times_steps(text, steps):
    """ceil(R x steps) with R the decimal the user wrote, against Fraction of that decimal (float products round:
    0.07 x 100 = 7.000000000000001 in float64, whose ceiling is 8)."""
    exact = Fraction(Decimal(text))
    config = TrainingConfig(steps=steps, warmup_ratio=float(text))  # as --warmup-ratio parses it
    assert config.num_warmup_steps == math.ceil(exact * steps)
    assert 0 <= config.num_warmup_steps <= steps


def test_the_command_lines_warmup_ratio_gives_the_steps_its_help_promises():
    from causalqwen.app import cli, commands

    for ratio, steps, warmup in (
        ("0.07", "100", 7),
        ("0.57", "100", 57),
        ("0.29", "100", 29),
        ("0.1", "1000", 100),
        ("0.07", "1", 1),
        ("0", "5", 0),
        ("1", "5", 5),
        ("1e-9", "10", 1),
    ):
        args = cli.build_parser().parse_args(
            ["train", "--base", "b", "--data", "d", "--out", "o", "--warmup-ratio", ratio, "--steps", steps]
        )
        assert commands._training_config(args).num_warmup_steps == warmup, (ratio, steps)
    assert 0.07 * 100 > 7 and 0.57 * 100 < 57  # float64 products on both sides of the exact one


def test_the_schedule_is_transformers_warm_up_cosine_step_by_step_and_saves_the_same_state():
    """`warmup_cosine_schedule` (torch alone) gives, at every step, the rates of transformers'
    ``get_cosine_schedule_with_warmup`` exactly, past the last step too, and a ``state_dict`` equal to its."""
    from transformers import get_cosine_schedule_with_warmup

    for warmup, steps in ((0, 1), (1, 4), (3, 7), (10, 10), (5, 3), (100, 1000), (7, 100)):
        ours_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
        theirs_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
        ours = warmup_cosine_schedule(ours_optimizer, warmup, steps)
        theirs = get_cosine_schedule_with_warmup(theirs_optimizer, warmup, steps)
        for step in range(steps + 3):
            assert ours.get_last_lr() == theirs.get_last_lr(), (warmup, steps, step)
            assert warmup_cosine_factor(step, warmup=warmup, steps=steps) == theirs.lr_lambdas[0](step)
            for optimizer, schedule in ((ours_optimizer, ours), (theirs_optimizer, theirs)):
                optimizer.step()
                schedule.step()
        assert ours.state_dict() == theirs.state_dict()


def cosine_with_warmup(step, warmup, steps, peak):
    """transformers' linear warm-up then cosine decay to 0, written out: the rate after ``step`` scheduler steps."""
    if step < warmup:
        return peak * step / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))


def test_the_warm_up_is_a_tenth_of_the_run_unless_given_and_a_4_step_run_reaches_the_learning_rate():
    assert DEFAULT_WARMUP_RATIO == 0.1
    for steps, warmup in ((1, 1), (4, 1), (10, 1), (11, 2), (1000, 100)):  # ceil(0.1 * steps), as transformers'
        assert TrainingConfig(steps=steps).num_warmup_steps == warmup
    assert TrainingConfig(steps=8, warmup_ratio=0.25).num_warmup_steps == 2
    assert TrainingConfig(steps=8, warmup_ratio=0).num_warmup_steps == 0
    assert TrainingConfig(steps=8, warmup_steps=3).num_warmup_steps == 3  # given steps win over the default ratio
    rates = {}
    for warmup in (None, 50):  # the default, and the command line's old warmup_steps=50
        config = TrainingConfig(steps=4, learning_rate=1e-3, warmup_steps=warmup)
        optimizer, scheduler = optimizer_and_schedule(torch.nn.Linear(2, 2), config)
        rates[warmup] = []
        for _ in range(4):
            optimizer.step()
            scheduler.step()
            rates[warmup].append(scheduler.get_last_lr()[0])
    assert rates[None] == pytest.approx([cosine_with_warmup(s, 1, 4, 1e-3) for s in range(1, 5)], rel=1e-12, abs=1e-20)
    assert max(rates[None]) == 1e-3  # the peak is the configured rate
    assert max(rates[50]) == pytest.approx(4 / 50 * 1e-3, rel=1e-12)  # the old default never got past 8% of it


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"warmup_steps": 5, "warmup_ratio": 0.1},
            "warmup_steps (5) and warmup_ratio (0.1) exclude each other: give one "
            "(warmup_ratio applies when warmup_steps is not given)",
        ),
        ({"warmup_ratio": 1.5}, "warmup_ratio must be a number from 0 to 1 or None, got 1.5"),
        ({"warmup_ratio": float("nan")}, "warmup_ratio must be a number from 0 to 1 or None, got nan"),
        ({"warmup_ratio": "0.1"}, "warmup_ratio must be a number from 0 to 1 or None, got '0.1'"),
        ({"save_total_limit": -1}, "save_total_limit must be an int >= 0, got -1"),
        ({"save_total_limit": 2.5}, "save_total_limit must be an int >= 0, got 2.5"),
    ],
)
def test_bad_warm_up_and_save_limit_settings_are_named(overrides, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        TrainingConfig(**overrides)


def test_save_total_limit_keeps_the_newest_checkpoints_the_run_wrote_and_nothing_else(tokenizer, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("not the run's")
    run = tmp_path / "run"
    claimed = RunDirectory.claim(run, "train")
    (run / "checkpoint-9").symlink_to(outside, target_is_directory=True)  # named like a newer checkpoint
    (run / "checkpoint-8").write_text("a file named like a checkpoint")
    (run / "checkpoint-7").mkdir()  # a directory the run did not write: no trainer_state.json
    (run / "checkpoint-7" / "notes.txt").write_text("mine")
    config = TrainingConfig(**CONFIG | {"steps": 5, "save_every": 1, "save_total_limit": 2})
    try:
        train(tiny_model(), synthetic_data(tokenizer), config, out_dir=claimed, progress=False)
    finally:
        claimed.release()
    names = sorted(name for name in os.listdir(run) if name.startswith("checkpoint-"))
    assert names == ["checkpoint-4", "checkpoint-5", "checkpoint-7", "checkpoint-8", "checkpoint-9"]
    assert os.path.islink(run / "checkpoint-9") and (outside / "precious.txt").read_text() == "not the run's"
    assert (run / "checkpoint-8").read_text().startswith("a file") and (run / "checkpoint-7" / "notes.txt").exists()
    assert json.loads((run / "checkpoint-5" / "trainer_state.json").read_text())["step"] == 5
    assert runs.remove_old_checkpoints(str(run), None) == [] and runs.remove_old_checkpoints(str(run), 0) == []
    assert runs.remove_old_checkpoints(str(run), 1) == [os.path.join(str(run), "checkpoint-4")]
    with pytest.raises(OSError, match="is a symbolic link or a special file.*left in place"):
        remove_run_output(run, "checkpoint-9")
    with pytest.raises(OSError, match="is not an output a train run writes"):
        remove_run_output(run, "notes.txt")
    with pytest.raises(OSError, match="is not a claimed causalqwen run directory"):
        remove_run_output(outside, "precious.txt")
    assert os.path.islink(run / "checkpoint-9") and (outside / "precious.txt").exists()


def test_without_a_limit_every_checkpoint_is_kept(tokenizer, tmp_path):
    assert TrainingConfig().save_total_limit is None  # the library keeps all, as transformers' TrainingArguments
    train(
        tiny_model(),
        synthetic_data(tokenizer),
        TrainingConfig(**CONFIG | {"steps": 4, "save_every": 1}),
        out_dir=str(tmp_path),
        progress=False,
    )
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("checkpoint-")) == [
        f"checkpoint-{step}" for step in range(1, 5)
    ]


def test_a_run_recorded_before_warmup_ratio_existed_resumes_unchanged(tokenizer, tmp_path, killed_after_first_save):
    """A run written by the version before: warmup_steps 50 (the command line's old default) and no warmup_ratio
    or save_total_limit in its records. Resumed with no warm-up given, it keeps its 50 and ends bit-exact."""
    old = CONFIG | {"steps": 7, "batch_size": 5, "warmup_steps": 50}
    data = synthetic_data(tokenizer)
    uninterrupted = tiny_model()
    train(uninterrupted, data, TrainingConfig(**old), None, str(tmp_path / "a"), progress=False)
    with killed_after_first_save():
        train(tiny_model(), data, TrainingConfig(**old), None, str(tmp_path / "b"), progress=False)
    state_file = tmp_path / "b" / "checkpoint-3" / "trainer_state.json"
    record = json.loads(state_file.read_text())
    del record["settings"]["training"]["warmup_ratio"]
    state_file.write_text(json.dumps(record))
    config_file = tmp_path / "b" / "training_config.json"
    stored = json.loads(config_file.read_text())
    del stored["warmup_ratio"], stored["save_total_limit"]
    config_file.write_text(json.dumps(stored))
    assert set(record["settings"]["training"]) == set(stored) - set(runs.LOGGING_SETTINGS)  # the old fields

    # A missing field compares as None: the same as a run that gives warmup_steps and no ratio.
    assert runs.settings_differences(record["settings"], runs.run_settings(TrainingConfig(**old), data, None)) == []
    ratio = {key: value for key, value in old.items() if key != "warmup_steps"} | {"warmup_ratio": 0.1}
    assert runs.settings_differences(record["settings"], runs.run_settings(TrainingConfig(**ratio), data, None)) == [
        "warmup_ratio is None in the checkpoint, 0.1 now",
        "warmup_steps is 50 in the checkpoint, None now",
    ]

    resumed = tiny_model()
    same_command = {key: value for key, value in old.items() if key != "warmup_steps"}  # no warm-up given
    train(resumed, data, TrainingConfig(**same_command), None, str(tmp_path / "b"), resume=True, progress=False)
    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    saved = json.loads((tmp_path / "b" / "checkpoint-7" / "trainer_state.json").read_text())["settings"]["training"]
    assert (saved["warmup_steps"], saved["warmup_ratio"]) == (50, None)


def test_the_progress_bar_says_when_it_evaluates(capsys):
    """The held-out metrics pause the steps: the bar is redrawn as "evaluating" before them, "training" after."""
    from causalqwen.app.tiny import build_tiny_causal_lm
    from causalqwen.app.training_run import train
    from causalqwen.files.data import TextDataset, collate, synthetic_texts
    from causalqwen.training import TrainingConfig

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    data = TextDataset(synthetic_texts(16, seed=0), tokenizer, max_length=24)
    held_out = collate(TextDataset(synthetic_texts(4, seed=1), tokenizer, max_length=24).items, tokenizer.pad_token_id)
    config = TrainingConfig(steps=2, batch_size=8, learning_rate=1e-3, eval_every=1, log_every=1)
    train(model, data, config, eval_batch=held_out, progress=True)
    bar = capsys.readouterr().err
    assert bar.count("evaluating:") >= 2 and "training:" in bar


# A bfloat16 base, converted and trained: the small new parameters move as they do in float32.
#
# A bfloat16 weight w moves only when an update exceeds half its spacing, 2**(floor(log2|w|) - 8) (8 significant
# bits). AdamW's first updates are about the learning rate, so at the command line's 1e-4 the diagonal of W_loc (1.0:
# half spacing 2**-9 below 1), b_scale (-2.25: 2**-7) and b_noise (0.1: 2**-12 = 2.4e-4) never move when AdamW runs
# on bfloat16 weights. The oracle of every run here is the same steps run on the float32 model (the bfloat16 weights
# upcast, which is exact).


SMALL = ("action.b_noise", "model.abduction.b_scale", "model.abduction.W_loc")  # W_loc: its diagonal


STEPS, BATCH = 6, 4


# The bfloat16 runs: each update (at most about the learning rate) is below half a spacing of b_scale, 2**-7, and
# the cosine schedule's updates add up to more than one spacing, 2**-6.
BF16_STEPS, BF16_RATE = 10, 5e-3


def _small_parameters(model) -> dict[str, torch.Tensor]:
    """b_noise, b_scale and diag(W_loc), as float32 copies."""
    named = dict(model.named_parameters())
    small = {name: named[name].detach().float().clone() for name in SMALL}
    small["model.abduction.W_loc"] = small["model.abduction.W_loc"].diagonal().clone()
    return small


def _bf16_spacing(values: torch.Tensor) -> torch.Tensor:
    """The distance from each value to the next bfloat16 away from zero: 2**(floor(log2|v|) - 7)."""
    return torch.exp2(torch.floor(torch.log2(values.abs())) - 7)


def _dtypes_in(file) -> set[str]:
    with safe_open(str(file), "pt") as handle:
        return {handle.get_slice(name).get_dtype() for name in handle.keys()}


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return str(path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A bfloat16 Qwen2 base (the tiny one, cast) saved to a directory, and its ``causalqwen convert`` output."""
    root = tmp_path_factory.mktemp("bf16")
    base, hf_tokenizer = build_tiny_base(seed=0)
    base.to(torch.bfloat16).save_pretrained(root / "base")
    hf_tokenizer.save_pretrained(root / "base")
    assert cli.main(["convert", "--base", str(root / "base"), "--out", str(root / "converted")]) == 0
    return root


def _float32_run(directory, texts, steps, learning_rate):
    """The float32 oracle: the saved model upcast (exact) and trained the CLI's way with the same settings."""
    model = CausalQwenForCausalLM.from_pretrained(directory).float()
    tokenizer = NumericTokenizer.from_pretrained(directory)
    config = TrainingConfig(steps=steps, batch_size=BATCH, learning_rate=learning_rate, weight_decay=0.01, seed=0)
    train(model, TextDataset(texts, tokenizer, 512), config, progress=False)
    return model


def _check_as_float32_rounded(trained: dict, oracle: dict, start: dict) -> None:
    r"""Each trained bfloat16 value is the float32 run's within half a spacing (the rounding to bfloat16) plus 1%
    of how far float32 moved it: the bfloat16 forward changes each gradient by about 2**-8 of itself, and AdamW's
    update m / sqrt(v) does not depend on the gradients' scale, so the float32 master weights follow the float32
    run closely (0.07% of the movement, measured). Where float32 moved a value by more than a spacing, it moved."""
    for name, value in trained.items():
        moved = (oracle[name] - start[name]).abs()
        assert ((value - oracle[name]).abs() <= _bf16_spacing(value) / 2 + moved / 100).all(), name
        far = moved > _bf16_spacing(start[name])
        assert far.any(), f"{name}: the settings move nothing by a spacing"
        assert (value[far] != start[name][far]).all(), f"{name} did not move where float32 moved it"


def test_convert_keeps_the_bases_bfloat16_by_default_and_casts_to_the_dtype_asked(converted, tmp_path, capsys):
    assert json.loads((converted / "converted" / "config.json").read_text())["dtype"] == "bfloat16"
    assert _dtypes_in(converted / "converted" / "model.safetensors") == {"BF16"}
    assert (
        cli.main(["convert", "--base", str(converted / "base"), "--out", str(tmp_path / "f32"), "--dtype", "float32"])
        == 0
    )
    assert "float32) written to" in capsys.readouterr().out
    assert _dtypes_in(tmp_path / "f32" / "model.safetensors") == {"F32"}
    bf16 = CausalQwenForCausalLM.from_pretrained(converted / "converted")
    f32 = CausalQwenForCausalLM.from_pretrained(tmp_path / "f32")
    assert bf16.dtype == torch.bfloat16 and f32.dtype == torch.float32
    assert f32.config.ovr_threshold == bf16.config.ovr_threshold  # one conversion, stored in another dtype
    for (name, a), (_, b) in zip(bf16.state_dict().items(), f32.state_dict().items()):
        assert torch.equal(a.float(), b), name  # bfloat16 -> float32 is exact


def test_cli_training_of_a_bfloat16_checkpoint_moves_the_small_parameters_as_float32_does(converted, tmp_path):
    """The command line's defaults (--dtype float32, --learning-rate 1e-4): every update is below half a bfloat16
    spacing of these parameters, and model/ holds the float32 run's parameters bit for bit (the same arithmetic)."""
    texts = synthetic_texts(24, seed=0)
    data = _jsonl(tmp_path / "train.jsonl", texts)
    start = _small_parameters(CausalQwenForCausalLM.from_pretrained(converted / "converted"))
    assert (
        cli.main(
            [
                "train",
                "--base",
                str(converted / "converted"),
                "--data",
                data,
                "--out",
                str(tmp_path / "run"),
                "--steps",
                str(STEPS),
                "--batch-size",
                str(BATCH),
            ]
        )
        == 0
    )
    assert _dtypes_in(tmp_path / "run" / "model" / "model.safetensors") == {"F32"}
    trained = CausalQwenForCausalLM.from_pretrained(tmp_path / "run" / "model")
    oracle = _float32_run(converted / "converted", texts, STEPS, 1e-4)
    for name, value in _small_parameters(trained).items():
        assert (value != start[name]).all(), f"{name} did not move"
        assert 1e-4 < _bf16_spacing(start[name]).min() / 2  # an update of about 1e-4 rounds away in bfloat16
        assert torch.equal(value, _small_parameters(oracle)[name]), name


def test_cli_training_in_bfloat16_keeps_float32_master_weights_and_writes_bfloat16(converted, tmp_path, caplog):
    """--dtype bfloat16 at a learning rate whose updates are below half a spacing of b_scale (-2.25: 2**-7) but add
    up to more than one: model/ is bfloat16 and holds the float32 run's values rounded to bfloat16."""
    texts = synthetic_texts(24, seed=0)
    data = _jsonl(tmp_path / "train.jsonl", texts)
    start = _small_parameters(CausalQwenForCausalLM.from_pretrained(converted / "converted"))
    with caplog.at_level("WARNING", logger="causalqwen.training"):
        assert (
            cli.main(
                [
                    "train",
                    "--base",
                    str(converted / "converted"),
                    "--data",
                    data,
                    "--out",
                    str(tmp_path / "run"),
                    "--steps",
                    str(BF16_STEPS),
                    "--batch-size",
                    str(BATCH),
                    "--learning-rate",
                    str(BF16_RATE),
                    "--dtype",
                    "bfloat16",
                ]
            )
            == 0
        )
    assert "in float32 (master weights" in caplog.text
    assert _dtypes_in(tmp_path / "run" / "model" / "model.safetensors") == {"BF16"}
    trained = _small_parameters(CausalQwenForCausalLM.from_pretrained(tmp_path / "run" / "model"))
    _check_as_float32_rounded(
        trained, _small_parameters(_float32_run(converted / "converted", texts, BF16_STEPS, BF16_RATE)), start
    )


def test_a_bfloat16_run_whose_rounding_erases_the_training_names_the_parameters(converted, tmp_path, caplog):
    """At the command line's learning rate (1e-4) for 4 steps, b_noise, b_scale and diag(W_loc) move in float32 by
    less than half their bfloat16 spacing: model/ holds them at their start, and a warning names them."""
    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(24, seed=0))
    start = _small_parameters(CausalQwenForCausalLM.from_pretrained(converted / "converted"))
    with caplog.at_level("WARNING", logger="causalqwen.training"):
        assert (
            cli.main(
                [
                    "train",
                    "--base",
                    str(converted / "converted"),
                    "--data",
                    data,
                    "--out",
                    str(tmp_path / "run"),
                    "--steps",
                    "4",
                    "--batch-size",
                    str(BATCH),
                    "--dtype",
                    "bfloat16",
                    "--warmup-steps",
                    "0",
                ]
            )
            == 0
        )
    trained = _small_parameters(CausalQwenForCausalLM.from_pretrained(tmp_path / "run" / "model"))
    assert all(torch.equal(trained[name], start[name]) for name in ("action.b_noise", "model.abduction.b_scale"))
    erased = [record.getMessage() for record in caplog.records if "erased all the training" in record.getMessage()]
    assert len(erased) == 1 and "action.b_noise" in erased[0] and "model.abduction.b_scale" in erased[0]
    assert "--dtype float32" in erased[0]


def test_python_training_of_a_bfloat16_model_uses_float32_master_weights_and_keeps_its_dtype(converted, caplog):
    texts = synthetic_texts(24, seed=0)
    model = CausalQwenForCausalLM.from_pretrained(converted / "converted")
    tokenizer = NumericTokenizer.from_pretrained(converted / "converted")
    start = _small_parameters(model)
    config = TrainingConfig(steps=BF16_STEPS, batch_size=BATCH, learning_rate=BF16_RATE, weight_decay=0.01, seed=0)
    with caplog.at_level("WARNING", logger="causalqwen.training"):
        train(model, TextDataset(texts, tokenizer, 512), config, progress=False)
    assert "trainable bfloat16 parameters" in caplog.text and "model.float()" in caplog.text
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    _check_as_float32_rounded(
        _small_parameters(model),
        _small_parameters(_float32_run(converted / "converted", texts, BF16_STEPS, BF16_RATE)),
        start,
    )


def test_a_bfloat16_run_resumes_bit_exactly_and_an_interrupted_one_keeps_its_dtype(
    converted, tmp_path, killed_after_first_save
):
    texts = synthetic_texts(24, seed=0)
    tokenizer = NumericTokenizer.from_pretrained(converted / "converted")
    config = TrainingConfig(steps=4, batch_size=BATCH, learning_rate=5e-3, save_every=2, seed=0)

    def model():
        return CausalQwenForCausalLM.from_pretrained(converted / "converted")

    uninterrupted = model()
    train(uninterrupted, TextDataset(texts, tokenizer, 512), config, out_dir=str(tmp_path / "a"), progress=False)
    interrupted = model()
    with killed_after_first_save():
        train(interrupted, TextDataset(texts, tokenizer, 512), config, out_dir=str(tmp_path / "b"), progress=False)
    assert {parameter.dtype for parameter in interrupted.parameters()} == {torch.bfloat16}
    # the checkpoint holds the float32 master weights of the trained parameters
    assert _dtypes_in(tmp_path / "b" / "checkpoint-2" / "model.safetensors") == {"BF16", "F32"}
    resumed = model()
    train(resumed, TextDataset(texts, tokenizer, 512), config, out_dir=str(tmp_path / "b"), resume=True, progress=False)
    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), name


def test_float16_is_refused_by_name_before_anything_is_written(converted, tmp_path, capsys):
    texts = synthetic_texts(8, seed=0)
    data = _jsonl(tmp_path / "train.jsonl", texts)
    for argv, message in [
        (["--dtype", "float16"], "--dtype float16 cannot train: float16 gradients need loss scaling"),
    ]:
        with pytest.raises(SystemExit) as exited:
            cli.main(
                ["train", "--base", str(converted / "converted"), "--data", data, "--out", str(tmp_path / "run"), *argv]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and message in err[-1], err
        assert not (tmp_path / "run").exists()
    assert (
        cli.main(["convert", "--base", str(converted / "base"), "--out", str(tmp_path / "f16"), "--dtype", "float16"])
        == 0
    )
    assert _dtypes_in(tmp_path / "f16" / "model.safetensors") == {"F16"}
    with pytest.raises(SystemExit) as exited:  # --dtype auto: the checkpoint's float16
        cli.main(
            [
                "train",
                "--base",
                str(tmp_path / "f16"),
                "--data",
                data,
                "--out",
                str(tmp_path / "run"),
                "--dtype",
                "auto",
                "--batch-size",
                "4",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and "float16 parameters (model.embed_tokens.weight" in err[-1], err
    assert "--dtype float32" in err[-1] and not (tmp_path / "run").exists()

    half = CausalQwenForCausalLM.from_pretrained(tmp_path / "f16")
    before = {name: value.clone() for name, value in half.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=r"float16 parameters \(model\.embed_tokens\.weight, .* and \d+ more\).*"
        r"model\.float\(\)",
    ):
        train(
            half,
            TextDataset(texts, NumericTokenizer.from_pretrained(tmp_path / "f16"), 512),
            TrainingConfig(steps=1, batch_size=4),
            out_dir=str(tmp_path / "run"),
            progress=False,
        )
    assert not (tmp_path / "run").exists()
    assert all(torch.equal(value, before[name]) for name, value in half.state_dict().items())


def test_the_dtype_option_names_its_choices(tmp_path, capsys):
    for command in (
        ["convert", "--base", "tiny", "--out", str(tmp_path / "c")],
        ["train", "--base", "tiny", "--data", "d.jsonl", "--out", str(tmp_path / "t")],
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main([*command, "--dtype", "float64"])
        err = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and "argument --dtype: invalid choice: 'float64'" in err[-1]
        assert "float32" in err[-1] and "bfloat16" in err[-1] and "auto" in err[-1]
    assert not (tmp_path / "c").exists() and not (tmp_path / "t").exists()


def test_the_loader_refuses_a_dtype_it_does_not_know_by_name():
    from causalqwen.app.commands import load_model_and_tokenizer

    for wrong in ("float64", "bf16", torch.bfloat16, None):
        with pytest.raises(ValueError, match=r"dtype must be one of float32, bfloat16, float16, auto, got "):
            load_model_and_tokenizer("tiny", dtype=wrong)
    model, _ = load_model_and_tokenizer("tiny", dtype="bfloat16")
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"weight_decay": 1e300},
            r"weight_decay must be a finite number within float32's range \(at most 3\.40282e\+38\), "
            r"got 1e\+300",
        ),
        ({"learning_rate": 1e39}, r"learning_rate must be a finite number within float32's range .*got 1e\+39"),
        ({"learning_rate": 1e300}, r"learning_rate must be a finite number within float32's range .*got 1e\+300"),
        ({"max_grad_norm": 1e39}, r"max_grad_norm must be a finite number within float32's range .*got 1e\+39"),
        (
            {"learning_rate": 0.5, "weight_decay": 2.0},
            r"learning_rate \* weight_decay must be < 1 .* got learning_rate=0\.5 \* weight_decay=2\.0 = 1",
        ),
        ({"learning_rate": 1e-3, "weight_decay": 1e5}, r"learning_rate=0\.001 \* weight_decay=100000\.0 = 100"),
    ],
)
def test_optimisation_settings_beyond_float32_or_a_decay_factor_outside_0_1_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainingConfig(**TWO_STEP_RUN | overrides)


def test_settings_at_the_edges_are_accepted():
    TrainingConfig(**TWO_STEP_RUN | {"learning_rate": 0.5, "weight_decay": 1.999})  # decay factor 0.0005 > 0
    TrainingConfig(**TWO_STEP_RUN | {"learning_rate": 1e38, "weight_decay": 0.0, "max_grad_norm": 3e38})


def test_divergence_stops_with_a_clear_error(tokenizer):
    config = TrainingConfig(**FOUR_STEP_RUN | {"learning_rate": 1e30, "weight_decay": 0.0, "steps": 6})
    with pytest.raises(TrainingDiverged, match=r"training diverged .* lower the learning rate \(now 1e\+30\)"):
        train(tiny_model(), tiny_data(tokenizer), config, progress=False)


def test_training_on_texts_without_a_next_token_is_refused(tokenizer):
    with pytest.raises(ValueError, match="none of the 8 training texts has two tokens"):
        train(tiny_model(), TextDataset([""] * 8, tokenizer), TrainingConfig(**FOUR_STEP_RUN), progress=False)


def test_training_settings_take_numpy_and_tensor_scalars_and_refuse_strings():
    config = TrainingConfig(
        steps=np.int64(5), batch_size=torch.tensor(2), learning_rate=np.float32(0.5), seed=np.int32(3)
    )
    assert (config.steps, config.batch_size, config.learning_rate, config.seed) == (5, 2, 0.5, 3)
    assert all(type(v) in (int, float, str, type(None)) for v in vars(config).values())  # plain JSON in checkpoints
    for field, value in [
        ("steps", True),
        ("steps", "5"),
        ("learning_rate", "1e-3"),
        ("seed", -1),
        ("weight_decay", float("nan")),
    ]:
        with pytest.raises(ValueError, match=field):
            TrainingConfig(**{field: value})
