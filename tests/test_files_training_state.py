"""Resuming a run (`causalqwen.files.training_state`): resume is strict.

Every tensor and number read back from a checkpoint is checked and named with its file (dtype, shape, range, a
tensor the training state does not hold, trainer-state numbers that contradict the checkpoint); a changed setting
is named unless allowed; nothing is written through a planted link; an untouched run resumes to its end.
"""

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_runs import (
    FOUR_STEP_RUN,
    SECRET,
    TWO_STEP_RUN,
    outside_file,
    resume,
    run_copy,
    run_until_first_checkpoint,
    tiny_data,
    tiny_model,
    with_tensor,
)

from causalqwen import train
from causalqwen.training import TrainingConfig


@pytest.mark.parametrize("name", ["metrics.jsonl", "training_config.json", "checkpoint-4", "checkpoint-4.partial"])
def test_a_resumed_run_never_writes_through_a_planted_link(tiny, finished_run, tmp_path, name):
    out = run_copy(finished_run, tmp_path)
    secret = outside_file(tmp_path)
    if name.startswith("checkpoint"):
        secret = secret.parent / "dir"  # a directory outside, with a file in it
        secret.mkdir()
        (secret / "keep.txt").write_text(SECRET)
    if (out / name).exists():
        os.remove(out / name)
    os.symlink(secret, out / name)
    with pytest.raises(OSError, match=rf"'{out / name}' is a symbolic link"):
        resume(tiny[1], out)
    if name.startswith("checkpoint"):
        assert os.listdir(secret) == ["keep.txt"] and (secret / "keep.txt").read_text() == SECRET
    else:
        assert secret.read_text() == SECRET
    assert os.path.islink(out / name)


def test_a_hard_linked_metrics_file_is_refused(tiny, finished_run, tmp_path):
    out = run_copy(finished_run, tmp_path)
    secret = outside_file(tmp_path)
    os.remove(out / "metrics.jsonl")
    os.link(secret, out / "metrics.jsonl")
    with pytest.raises(OSError, match=r"metrics\.jsonl' has 2 hard links"):
        resume(tiny[1], out)
    assert secret.read_text() == SECRET


def _huge(tensor):
    return torch.full(tensor.shape, 1e300, dtype=torch.float64)


@pytest.mark.parametrize(
    "file, tensor, value, message",
    [
        ("model.safetensors", "action.b_noise", _huge, r"action\.b_noise holds 1e\+300, beyond the range of float32"),
        (
            "training_state.safetensors",
            "optimizer.0.exp_avg",
            _huge,
            r"optimizer\.0\.exp_avg holds 1e\+300, beyond the range of float32",
        ),
        (
            "training_state.safetensors",
            "optimizer.0.exp_avg",
            lambda t: t.long(),
            r"optimizer\.0\.exp_avg is stored as torch\.int64, not a floating-point tensor",
        ),
        (
            "training_state.safetensors",
            "optimizer.0.exp_avg_sq",
            lambda t: -torch.ones_like(t),
            r"optimizer\.0\.exp_avg_sq holds negative values",
        ),
        (
            "training_state.safetensors",
            "optimizer.0.step",
            lambda t: torch.tensor(-3.0),
            r"optimizer\.0\.step holds negative values",
        ),
        (
            "training_state.safetensors",
            "rng.torch",
            lambda t: t.double(),
            r"rng\.torch is stored as torch\.float64, not torch\.uint8",
        ),
        (
            "training_state.safetensors",
            "rng.numpy",
            lambda t: t - 2**40,
            r"rng\.numpy holds values outside \[0, 2\*\*32\)",
        ),
        (
            "divergence_reference.safetensors",
            "abduction.W_loc",
            lambda t: t.long(),
            r"abduction\.W_loc is stored as torch\.int64, not a floating-point tensor",
        ),
        (
            "divergence_reference.safetensors",
            "abduction.b_scale",
            lambda t: torch.full_like(t, float("nan")),
            r"abduction\.b_scale holds NaN or ±inf values",
        ),
        (
            "divergence_reference.safetensors",
            "abduction.b_loc",
            _huge,
            r"abduction\.b_loc holds 1e\+300, beyond the range of float32",
        ),
    ],
)
def test_resume_checks_every_tensor_it_reads_and_names_the_file(
    tiny, finished_run, tmp_path, file, tensor, value, message
):
    out = run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / file
    with_tensor(path, tensor, value)
    with pytest.raises(
        OSError, match=rf"{re.escape(str(path))}'?(: | do(es)? not fit (this run|the model): ).*{message}"
    ):
        resume(tiny[1], out)


def test_resume_refuses_a_tensor_the_training_state_does_not_hold(tiny, finished_run, tmp_path):
    out = run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / "training_state.safetensors"
    tensors = load_file(path)
    save_file(tensors | {"rng.extra": torch.zeros(3)}, path)
    with pytest.raises(OSError, match=rf"'{path}' does not fit this run: rng\.extra is not a tensor of a causalqwen"):
        resume(tiny[1], out)
    save_file({key: value for key, value in tensors.items() if key != "optimizer.1.exp_avg_sq"}, path)
    with pytest.raises(
        OSError, match=r"optimizer\.1 holds \['exp_avg', 'step'\], AdamW keeps \['exp_avg', 'exp_avg_sq', 'step'\]"
    ):
        resume(tiny[1], out)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda record: record["optimizer_param_groups"][0].update(lr=float("nan")), "NaN is not a number"),
        (
            lambda record: record["optimizer_param_groups"][0].update(lr="0.1"),
            r"optimizer_param_groups\[0\]\.lr is a str, this run's is a number",
        ),
        (lambda record: record["scheduler"].update(base_lrs=[1e400, 1e400]), "1e400 is beyond the range of a float"),
    ],
)
def test_resume_refuses_non_finite_or_mistyped_numbers_in_the_trainer_state(
    tiny, finished_run, tmp_path, edit, message
):
    out = run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / "trainer_state.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record).replace("1e+400", "1e400").replace("Infinity", "1e400"))
    with pytest.raises(OSError, match=rf"'{path}'.*{message}"):
        resume(tiny[1], out)


@pytest.mark.parametrize(
    "field, value", [("last_divergence", "x"), ("last_divergence", float("nan")), ("multiplier", float("inf"))]
)
def test_resume_refuses_a_bound_state_that_is_not_a_number(tiny, finished_run, tmp_path, field, value):
    out = run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / "divergence_bound.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {field: value}))
    with pytest.raises(OSError, match=rf"divergence_bound\.json holds (no multiplier >= 0|last_divergence {value!r})"):
        resume(tiny[1], out)


def test_an_untouched_run_still_resumes_to_the_end(tiny, finished_run, tmp_path):
    out = run_copy(finished_run, tmp_path)
    history = resume(tiny[1], out)
    assert history[-1]["step"] == 4 and (out / "checkpoint-4" / "model.safetensors").is_file()
    assert sorted(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()) == [1, 2, 3, 4]


def _edit_state(out, edit):
    path = out / "checkpoint-2" / "trainer_state.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda r: r["optimizer_param_groups"][0].update(weight_decay=1e9),
            r"optimizer_param_groups\[0\]\.weight_decay is 1000000000\.0, the run's settings give 0\.01",
        ),
        (
            lambda r: r["optimizer_param_groups"][0].update(lr=1e10),
            r"optimizer_param_groups\[0\]\.lr is 10000000000\.0, the run's settings give 0\.0(;|$)",
        ),
        (
            lambda r: r["optimizer_param_groups"][1].update(maximize=True),
            r"optimizer_param_groups\[1\]\.maximize is True, the run's settings give False",
        ),
        (
            lambda r: r["optimizer_param_groups"][0].update(initial_lr=1.0),
            r"optimizer_param_groups\[0\]\.initial_lr is 1\.0, the run's settings give 0\.003",
        ),
        (
            lambda r: r["optimizer_param_groups"][0].update(params=r["optimizer_param_groups"][0]["params"][::-1]),
            r"optimizer_param_groups\[0\]\.params is \[\d+, .*\], this run's optimizer has \[0, 1, ",
        ),
        (
            lambda r: r["scheduler"].update(base_lrs=[0.1, 0.1]),
            r"scheduler\.base_lrs\[0\] is 0\.1, the run's settings give 0\.003",
        ),
        (lambda r: r["scheduler"].update(last_epoch=7), r"scheduler\.last_epoch is 7, the run's settings give 2"),
    ],
)
@pytest.mark.parametrize("allow", [True, False])
def test_resume_refuses_trainer_state_numbers_that_contradict_the_checkpoint(
    tiny, finished_run, tmp_path, edit, message, allow
):
    out = run_copy(finished_run, tmp_path)
    path = _edit_state(out, edit)
    config = TrainingConfig(**TWO_STEP_RUN | {"max_u_divergence": 1.0} | ({"steps": 4} if allow else {}))
    with pytest.raises(
        OSError,
        match=rf"the training state '{re.escape(str(path))}' contradicts its checkpoint "
        rf"\(step 2 and the settings it records\): .*{message}",
    ):
        train(
            tiny_model(),
            tiny_data(tiny[1]),
            config,
            out_dir=str(out),
            resume=True,
            progress=False,
            allow_changed_settings=allow,
        )


@pytest.mark.parametrize("step", [100, 3, 1])
def test_resume_refuses_a_recorded_step_that_is_not_the_directory_s(tiny, finished_run, tmp_path, step):
    out = run_copy(finished_run, tmp_path)
    path = _edit_state(out, lambda r: r.update(step=step))
    with pytest.raises(
        OSError, match=rf"'{re.escape(str(path))}' records step {step}, but its directory is checkpoint-2"
    ):
        resume(tiny[1], out)


def test_an_allowed_new_learning_rate_and_weight_decay_apply_and_the_result_resumes_again(tiny, finished_run, tmp_path):
    from transformers import get_cosine_schedule_with_warmup

    out = run_copy(finished_run, tmp_path)
    history = resume(tiny[1], out, learning_rate=1e-3, weight_decay=0.05)
    parameter = torch.nn.Parameter(torch.zeros(1))
    schedule = get_cosine_schedule_with_warmup(torch.optim.SGD([parameter], lr=1e-3), 1, 4)
    expected = 1e-3 * schedule.lr_lambdas[0](3)
    assert [r["train/learning_rate"] for r in history if r["step"] == 3] == [pytest.approx(expected, rel=1e-12)]
    record = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert record["scheduler"]["base_lrs"] == [1e-3, 1e-3]
    assert [g["weight_decay"] for g in record["optimizer_param_groups"]] == [0.05, 0.0]
    # the checkpoint this wrote agrees with the settings it records: it resumes (here: nothing left to do)
    resume(tiny[1], out, learning_rate=1e-3, weight_decay=0.05)


def test_an_optimizer_tensor_beyond_the_parameters_is_named_with_their_count_in_words():
    import torch

    from causalqwen.files.training_state import _optimizer_state

    one = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    _, problems = _optimizer_state({"optimizer.3.exp_avg": torch.zeros(2)}, one)
    assert problems == ["optimizer.3.exp_avg names no parameter of the optimizer (it has 1 parameter)"]
    two = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))])
    _, problems = _optimizer_state({"optimizer.3.exp_avg": torch.zeros(2)}, two)
    assert problems == ["optimizer.3.exp_avg names no parameter of the optimizer (it has 2 parameters)"]


@pytest.mark.parametrize(
    "change, pattern",
    [
        ({"learning_rate": 1e-3}, r"learning_rate is 0\.003 in the checkpoint, 0\.001 now"),
        ({"batch_size": 2}, "batch_size is 4 in the checkpoint, 2 now"),
        ({"seed": 1}, "seed is 0 in the checkpoint, 1 now"),
        ({"data_seed": 5}, r"the training data differ \(sha256 \w{12} in the checkpoint, \w{12} now\)"),
    ],
)
def test_resume_names_every_changed_setting_and_the_flag_overrides(tokenizer, tmp_path, monkeypatch, change, pattern):
    out = tmp_path / "run"
    run_until_first_checkpoint(tokenizer, out, monkeypatch)
    data = tiny_data(tokenizer, seed=change.pop("data_seed", 0))
    config = TrainingConfig(**FOUR_STEP_RUN | change | {"log_every": 2, "eval_every": 1})  # logging may change freely
    with pytest.raises(ValueError, match=pattern + ".*pass allow_changed_settings"):
        train(tiny_model(), data, config, out_dir=str(out), resume=True, progress=False)
    history = train(
        tiny_model(),
        data,
        config,
        out_dir=str(out),
        resume=True,
        progress=False,
        allow_changed_settings=True,
    )
    assert history[-1]["step"] == 4


def test_resume_refuses_a_checkpoint_tensor_of_the_wrong_dtype(tokenizer, tmp_path, monkeypatch):
    out = tmp_path / "run"
    run_until_first_checkpoint(tokenizer, out, monkeypatch)
    weights = out / "checkpoint-2" / "model.safetensors"
    state = load_file(weights)
    state["action.b_noise"] = torch.full_like(state["action.b_noise"], 10**9, dtype=torch.int32)
    save_file(state, weights)
    with pytest.raises(OSError, match=r"action\.b_noise is stored as I32, but the model's tensor is floating-point"):
        train(
            tiny_model(),
            tiny_data(tokenizer),
            TrainingConfig(**FOUR_STEP_RUN),
            out_dir=str(out),
            resume=True,
            progress=False,
        )
    optimizer_file = out / "checkpoint-2" / "training_state.safetensors"
    state["action.b_noise"] = state["action.b_noise"].float()
    save_file(state, weights)
    tensors = load_file(optimizer_file)
    first = next(key for key in tensors if key.endswith(".exp_avg"))
    tensors[first] = tensors[first][:1]
    save_file(tensors, optimizer_file)
    with pytest.raises(OSError, match=rf"{first} has shape .* the parameter needs"):
        train(
            tiny_model(),
            tiny_data(tokenizer),
            TrainingConfig(**FOUR_STEP_RUN),
            out_dir=str(out),
            resume=True,
            progress=False,
        )


def test_resume_needs_a_run_and_survives_a_metrics_line_cut_short(tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="nothing to resume: .* holds no causalqwen run"):
        train(
            tiny_model(),
            tiny_data(tokenizer),
            TrainingConfig(**FOUR_STEP_RUN),
            out_dir=str(tmp_path / "none"),
            resume=True,
            progress=False,
        )
    assert not (tmp_path / "none").exists()
    out = tmp_path / "run"
    run_until_first_checkpoint(tokenizer, out, monkeypatch)
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 3, "train/tot')  # the line a kill -9 cut in half
    train(
        tiny_model(),
        tiny_data(tokenizer),
        TrainingConfig(**FOUR_STEP_RUN),
        out_dir=str(out),
        resume=True,
        progress=False,
    )
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    (out / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: not a metrics record"):
        train(
            tiny_model(),
            tiny_data(tokenizer),
            TrainingConfig(**FOUR_STEP_RUN),
            out_dir=str(out),
            resume=True,
            progress=False,
        )
