"""The training loop: presets, optimizer groups, checkpoints written atomically, bit-exact resume, output rules."""

import json
import os

import pytest
import torch

from causalqwen import CausalQwenForCausalLM, NumericTokenizer, training
from causalqwen.data import TextDataset, collate, synthetic_texts
from causalqwen.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.training import (
    TrainingConfig,
    latest_checkpoint,
    parameter_groups,
    set_trainable,
    train,
)


@pytest.fixture(scope="module")
def tokenizer():
    return NumericTokenizer(build_tiny_base(seed=0)[1])


def _model(**overrides):
    """The tiny CausalQwen (its tokenizer is the module fixture `tokenizer`: the same tokenizer)."""
    return build_tiny_causal_lm(seed=0, init_seed=0, **overrides).model


def _data(tokenizer, n=48, seed=0):
    return TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=32)


CONFIG = dict(steps=6, batch_size=4, learning_rate=3e-3, warmup_steps=2, preset="all", eval_every=3, save_every=3,
              log_every=1, seed=0)


def test_presets_choose_the_trainable_parameters(tokenizer):
    model = _model()
    causal = set_trainable(model, "causal")
    new_modules = ("model.numerical_embedding.", "model.abduction.", "action.")  # the Qwen2 stack is the rest of model.*
    assert causal and all(n.startswith(new_modules) for n in causal)
    assert "action.b_noise" in causal and "model.numerical_embedding.w_num" in causal
    assert not any(p.requires_grad for n, p in model.named_parameters() if not n.startswith(new_modules))
    assert set(set_trainable(model, "abduction")) == {n for n, _ in model.named_parameters() if n.startswith("model.abduction.")}
    assert len(set_trainable(model, "all")) == len(list(model.parameters()))
    learnable = _model(learnable_threshold=True)
    assert "action.ovr_threshold" in set_trainable(learnable, "causal")  # the head owns the threshold
    with pytest.raises(ValueError, match="unknown preset 'everything'; choose one of causal, abduction, all"):
        set_trainable(model, "everything")
    with pytest.raises(ValueError, match="unknown preset"):
        TrainingConfig(preset="everything")


def test_weight_decay_applies_to_matrices_only(tokenizer):
    model = _model()
    set_trainable(model, "causal")
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert any(p is model.action.b_noise for p in no_decay["params"])
    assert any(p is model.numerical_embedding.w_num for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == sum(p.requires_grad for p in model.parameters())


def test_training_lowers_the_loss_and_writes_a_complete_run(tokenizer, tmp_path):
    model = _model()
    eval_batch = collate(_data(tokenizer, 8, seed=9).items, tokenizer.pad_token_id)
    history = train(model, _data(tokenizer), TrainingConfig(**CONFIG | {"steps": 12}), eval_batch, str(tmp_path), progress=False)
    losses = [r["train/total_loss"] for r in history]
    assert sum(losses[-3:]) < sum(losses[:3])
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 13))
    assert "eval/num_f1" in lines[2] and "dist/ovr_prob_sum_median_causal" in lines[2] and "eval/num_f1" not in lines[1]
    assert latest_checkpoint(str(tmp_path)).endswith("checkpoint-12")
    for step in (3, 6, 9, 12):
        files = set(os.listdir(tmp_path / f"checkpoint-{step}"))
        assert files == {"config.json", "model.safetensors", "training_state.safetensors", "trainer_state.json",
                         "history.json", "causalqwen_auto.py", "generation_config.json"}  # no pickle anywhere
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]
    reloaded = CausalQwenForCausalLM.from_pretrained(tmp_path / "checkpoint-12")
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_resume_after_an_interruption_is_bit_exact(tokenizer, tmp_path, monkeypatch):
    """Kill the run right after its step-3 checkpoint; resuming ends with the uninterrupted run's parameters."""
    eval_batch = collate(_data(tokenizer, 8, seed=9).items, tokenizer.pad_token_id)
    config = TrainingConfig(**CONFIG | {"steps": 7, "batch_size": 5})  # 48 // 5 = 9 batches: step 3 is mid-epoch
    uninterrupted = _model()
    full_history = train(uninterrupted, _data(tokenizer), config, eval_batch, str(tmp_path / "a"), progress=False)

    save = training._save_checkpoint

    def save_then_die(*args, **kwargs):
        path = save(*args, **kwargs)
        raise KeyboardInterrupt("killed after " + path)

    monkeypatch.setattr(training, "_save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(_model(), _data(tokenizer), config, eval_batch, str(tmp_path / "b"), progress=False)
    monkeypatch.setattr(training, "_save_checkpoint", save)
    resumed = _model()  # a fresh process would rebuild the model the same way
    history = train(resumed, _data(tokenizer), config, eval_batch, str(tmp_path / "b"), resume=True, progress=False)

    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert history == full_history
    log = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert log == list(range(1, 8))


def test_output_directory_rules(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 3})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for overwrite in (False, True):  # a directory no run wrote is never used, let alone emptied
        with pytest.raises(ValueError, match="exists and is not a causalqwen run .*never deletes files it did not write"):
            train(_model(), _data(tokenizer), config, out_dir=str(foreign), overwrite=overwrite, progress=False)
        assert os.listdir(foreign) == ["notes.txt"]  # nothing written, nothing deleted
    run = tmp_path / "run"
    train(_model(), _data(tokenizer), config, out_dir=str(run), progress=False)
    with pytest.raises(ValueError, match="holds a previous train run; pass resume to continue it or overwrite"):
        train(_model(), _data(tokenizer), config, out_dir=str(run), progress=False)
    (run / "train.jsonl").write_text("the user's data, kept in the run directory")
    train(_model(), _data(tokenizer), config, out_dir=str(run), overwrite=True, progress=False)
    assert (run / "train.jsonl").read_text().startswith("the user's data")
    assert {"causalqwen-run.json", "training_config.json", "metrics.jsonl", "checkpoint-3", "train.jsonl"} <= set(os.listdir(run))


def test_resume_refuses_a_checkpoint_of_another_model_config(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 3})
    train(_model(), _data(tokenizer), config, out_dir=str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="its model config differs in ovr_threshold"):
        train(_model(ovr_threshold=50.0), _data(tokenizer), TrainingConfig(**CONFIG | {"steps": 5}),
              out_dir=str(tmp_path), resume=True, progress=False)


def test_resume_from_a_truncated_checkpoint_names_the_file(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 3})
    train(_model(), _data(tokenizer), config, out_dir=str(tmp_path), progress=False)
    (checkpoint,) = [d for d in os.listdir(tmp_path) if d.startswith("checkpoint-")]
    weights = tmp_path / checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(OSError, match=r"cannot resume from .*model\.safetensors.* cannot be read"):
        train(_model(), _data(tokenizer), TrainingConfig(**CONFIG | {"steps": 5}),
              out_dir=str(tmp_path), resume=True, progress=False, allow_changed_settings=True)


def test_bad_training_configs_and_datasets(tokenizer):
    for field, value in [("steps", 0), ("batch_size", -1), ("learning_rate", 0.0), ("report_to", "mlflow")]:
        with pytest.raises(ValueError, match=field):
            TrainingConfig(**{field: value})
    with pytest.raises(ValueError, match="too few for one batch of 64"):
        train(_model(), _data(tokenizer, 10), TrainingConfig(**CONFIG | {"batch_size": 64}), progress=False)


@pytest.mark.parametrize("sink, package", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_report_to_needs_its_package_and_is_never_required(tokenizer, tmp_path, sink, package):
    import importlib.util

    config = TrainingConfig(**CONFIG | {"steps": 1, "report_to": sink})
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here; the error path cannot be exercised")
    with pytest.raises(ValueError, match=f"report_to='{sink}' needs the {package} package"):
        train(_model(), _data(tokenizer), config, out_dir=str(tmp_path / "run"), progress=False)


def test_the_progress_bar_never_shows_a_nan_loss_at_eval_only_steps(tokenizer, capsys):
    """An eval step that is not a log step has no training loss: the bar keeps the last one (it showed nan)."""
    eval_batch = collate(_data(tokenizer, n=4, seed=1).items, tokenizer.pad_token_id)
    config = TrainingConfig(**CONFIG | {"steps": 4, "log_every": 4, "eval_every": 1})
    train(_model(), _data(tokenizer), config, eval_batch=eval_batch, progress=True)
    bar = capsys.readouterr().err
    assert "training" in bar and "loss=" in bar and "nan" not in bar
