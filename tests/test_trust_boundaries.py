"""Trust boundaries: what causalqwen reads is data, never code; a run deletes only what it wrote;
resume is strict; the public doors refuse a misspelt keyword, a wrong type or a setting that would give
a silently wrong answer, by name."""

import copy
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from wall_clock import budget

from causalqwen import CausalQwenForCausalLM, NumericTokenizer, generate, train
from causalqwen.app import cli, runs
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm, save_tiny_base
from causalqwen.configuration import CausalQwenConfig
from causalqwen.files.checkpoint import weight_files
from causalqwen.files.data import TextDataset, read_jsonl, synthetic_texts
from causalqwen.files.rundir import LOCK, MARKER, RunDirectory
from causalqwen.float32 import format_number
from causalqwen.inference import traditional_probabilities
from causalqwen.kernels.fused import fused_ovr_classification_loss
from causalqwen.numbers import parse_number
from causalqwen.training import TrainingConfig, TrainingDiverged


class _Planted:
    """A pickle that runs code when loaded: unpickling it creates the file ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(target, witness):
    with open(target, "wb") as handle:
        pickle.dump(_Planted(witness), handle)


@pytest.fixture(scope="module")
def tokenizer():
    return NumericTokenizer(build_tiny_base(seed=0)[1])


def _model(**overrides):
    """The tiny CausalQwen (its tokenizer is the module fixture `tokenizer`: the same tokenizer)."""
    return build_tiny_causal_lm(seed=0, init_seed=0, **overrides).model


@pytest.fixture(scope="module")
def saved(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "model"
    _model().save_pretrained(path)
    return path


def _copy(saved, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(saved, target)
    return target


def _data(tokenizer, n=24, seed=0):
    return TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=32)


CONFIG = dict(
    steps=4,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=1,
    preset="all",
    eval_every=2,
    save_every=2,
    log_every=1,
    seed=0,
)


def _run_until_first_checkpoint(tokenizer, out, monkeypatch, **overrides):
    """A run killed right after its step-2 checkpoint."""
    save = runs.save_checkpoint

    def save_then_die(*args, **kwargs):
        save(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(_model(), _data(tokenizer), TrainingConfig(**CONFIG | overrides), out_dir=str(out), progress=False)
    monkeypatch.setattr(runs, "save_checkpoint", save)


# ---------------------------------------------------------------------------------------------
# Nothing is unpickled
# ---------------------------------------------------------------------------------------------


def test_a_planted_training_state_pickle_is_never_loaded(tokenizer, tmp_path, monkeypatch):
    out, witness = tmp_path / "run", tmp_path / "pwned"
    _run_until_first_checkpoint(tokenizer, out, monkeypatch)
    checkpoint = out / "checkpoint-2"
    assert not [name for name in os.listdir(checkpoint) if name.endswith((".pt", ".bin", ".pkl"))]
    _plant(checkpoint / "training_state.pt", witness)  # beside the real state: ignored
    train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out), resume=True, progress=False)
    assert not witness.exists()

    out2 = tmp_path / "run2"
    _run_until_first_checkpoint(tokenizer, out2, monkeypatch)
    for name in ("trainer_state.json", "training_state.safetensors"):  # an old-format checkpoint: only the pickle
        os.remove(out2 / "checkpoint-2" / name)
    _plant(out2 / "checkpoint-2" / "training_state.pt", witness)
    with pytest.raises(OSError, match=r"training_state\.pt' is a pickle .* never loaded"):
        train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out2), resume=True, progress=False)
    assert not witness.exists()


def test_a_directory_with_only_a_pickled_model_is_refused(saved, tmp_path):
    witness = tmp_path / "pwned"
    target = _copy(saved, tmp_path)
    os.remove(target / "model.safetensors")
    _plant(target / "pytorch_model.bin", witness)
    with pytest.raises(
        OSError, match=r"holds no model\.safetensors .*pytorch_model\.bin \(pickle\), which causalqwen never loads"
    ):
        CausalQwenForCausalLM.from_pretrained(target)
    with pytest.raises(ValueError, match="use_safetensors=False would unpickle"):
        CausalQwenForCausalLM.from_pretrained(saved, use_safetensors=False)
    qwen_dir = tmp_path / "qwen"
    save_tiny_base(qwen_dir)
    os.remove(qwen_dir / "model.safetensors")
    _plant(qwen_dir / "pytorch_model.bin", witness)
    with pytest.raises(OSError, match="never loads"):
        CausalQwenForCausalLM.from_qwen(str(qwen_dir))
    assert not witness.exists()


@pytest.mark.parametrize(
    "shard", ["../outside/model.safetensors", "/ABSOLUTE/model.safetensors", "sub/../../x.safetensors"]
)
def test_index_shards_outside_the_directory_are_refused(saved, tmp_path, shard):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(saved / "model.safetensors", outside / "model.safetensors")
    shard = shard.replace("/ABSOLUTE", str(outside))
    target = _copy(saved, tmp_path)
    os.remove(target / "model.safetensors")
    names = list(load_file(outside / "model.safetensors"))
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: shard for k in names}})
    )
    with pytest.raises(OSError, match="outside its directory"):
        CausalQwenForCausalLM.from_pretrained(target)


def test_a_shard_inside_the_directory_loads(saved, tmp_path):
    target = _copy(saved, tmp_path)
    (target / "shards").mkdir()
    os.replace(target / "model.safetensors", target / "shards" / "part.safetensors")
    names = list(load_file(target / "shards" / "part.safetensors"))
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: "shards/./part.safetensors" for k in names}})
    )
    assert weight_files(target) == [str(target / "shards" / "part.safetensors")]
    CausalQwenForCausalLM.from_pretrained(target)


# ---------------------------------------------------------------------------------------------
# Config validated, sizes against headers, before allocation
# ---------------------------------------------------------------------------------------------


def _edit_config(path, **fields):
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        (
            "vocab_size",
            10**12,
            r"config\.json says vocab_size=1000000000000, hidden_size=64, but model\.embed_tokens\.weight",
        ),
        ("num_hidden_layers", 10**6, r"num_hidden_layers=1000000, but .* holds 2 layers"),
        ("intermediate_size", 10**9, r"intermediate_size=1000000000, but model\.layers\.0\.mlp\.gate_proj\.weight"),
    ],
)
def test_a_config_announcing_huge_sizes_fails_before_allocating(saved, tmp_path, field, value, pattern):
    target = _copy(saved, tmp_path)
    _edit_config(target, **{field: value}, **({"layer_types": None} if field == "num_hidden_layers" else {}))
    started = time.perf_counter()
    with pytest.raises(ValueError, match=pattern):  # an allocation would have been a MemoryError / RuntimeError
        CausalQwenForCausalLM.from_pretrained(target)
    assert time.perf_counter() - started < budget(30)  # generous: the check reads headers only (milliseconds)


def test_a_qwen_base_with_a_huge_vocabulary_fails_before_allocating(tmp_path):
    qwen_dir = tmp_path / "qwen"
    save_tiny_base(qwen_dir)
    _edit_config(qwen_dir, vocab_size=10**12)
    with pytest.raises(ValueError, match="vocab_size=1000000000000"):
        CausalQwenForCausalLM.from_qwen(str(qwen_dir))


@pytest.mark.parametrize(
    "field, value, error, pattern",
    [
        ("detach_gate", "false", TypeError, r"detach_gate must be true or false \(a JSON boolean\), got 'false'"),
        ("learnable_threshold", 1, TypeError, "learnable_threshold must be true or false"),
        ("num_token_id", 1.5, TypeError, "num_token_id must be an integer, got 1.5"),
        ("ovr_threshold", "100", TypeError, "ovr_threshold must be a number, got '100'"),
        ("ignore_index", None, TypeError, "ignore_index must be an integer, got None"),
        ("ovr_threshold", -3e38, ValueError, r"ovr_threshold must be a number in \[-1e\+30, 1e\+30\], got -3e\+38"),
        ("noise_init", 3e38, ValueError, r"noise_init must be a number in \[-1e\+30, 1e\+30\]"),
        ("abduction_scale_init", 0.0, ValueError, r"abduction_scale_init must be a number in \(0, 1e\+30\]"),
        ("scale_eps", 1e-45, ValueError, r"scale_eps must be a number in \[1e-30, 1e\+30\]"),
        ("gate_alpha", float("nan"), ValueError, "gate_alpha must be finite"),
    ],
)
def test_config_fields_are_type_and_range_checked(saved, tmp_path, field, value, error, pattern):
    config = CausalQwenConfig.from_pretrained(saved).to_dict()
    with pytest.raises(error, match=pattern):
        CausalQwenConfig.from_dict(config | {field: value})
    target = _copy(saved, tmp_path)
    _edit_config(target, **{field: value})
    with pytest.raises(ValueError, match=r"config\.json: .*" + pattern.split(" must")[0]):  # the file is named
        CausalQwenForCausalLM.from_pretrained(target)


@pytest.mark.parametrize("return_decisions", [False, True])
@pytest.mark.parametrize(
    "settings",
    [
        dict(ovr_threshold=-1e30),
        dict(ovr_threshold=1e30),
        dict(noise_init=1e30),
        dict(abduction_scale_init=1e30),
        dict(scale_eps=1e-30),
        dict(scale_eps=1e30),
    ],
)
def test_settings_at_their_limits_keep_loss_and_gradients_finite(tokenizer, settings, return_decisions):
    model = _model(**settings)
    batch = tokenizer(["The price is 12.5 yuan and 3 cups.", "A week has 7 days"])
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels, return_decisions=return_decisions)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or bool(torch.isfinite(parameter.grad).all()), name


# ---------------------------------------------------------------------------------------------
# Output directories: only what a run wrote is deleted; one run at a time
# ---------------------------------------------------------------------------------------------


def test_overwrite_removes_only_run_outputs_and_never_a_foreign_directory(tokenizer, tmp_path):
    config = TrainingConfig(**CONFIG | {"steps": 2})
    data_file = tmp_path / "run" / "train.jsonl"
    train(_model(), _data(tokenizer), config, out_dir=str(tmp_path / "run"), progress=False)
    data_file.write_text('{"text": "mine"}\n')
    (tmp_path / "run" / "notes.txt").write_text("mine")
    train(_model(), _data(tokenizer), config, out_dir=str(tmp_path / "run"), overwrite=True, progress=False)
    assert data_file.read_text() == '{"text": "mine"}\n' and (tmp_path / "run" / "notes.txt").exists()

    for marker in (None, "training_config.json"):  # an old run's file is not a marker
        foreign = tmp_path / f"foreign-{marker}"
        foreign.mkdir()
        (foreign / "keep.txt").write_text("x")
        if marker:
            (foreign / marker).write_text("{}")
        before = sorted(os.listdir(foreign))
        with pytest.raises(ValueError, match="is not a causalqwen run"):
            RunDirectory.claim(foreign, "train", overwrite=True)
        with pytest.raises(ValueError, match="is not a causalqwen run"):
            RunDirectory.claim(foreign, "demo")
        assert sorted(os.listdir(foreign)) == before


def test_the_demo_never_replaces_a_training_run(tokenizer, tmp_path, capsys):
    run = tmp_path / "run"
    train(_model(), _data(tokenizer), TrainingConfig(**CONFIG | {"steps": 2}), out_dir=str(run), progress=False)
    before = sorted(os.listdir(run))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--out", str(run), "--steps", "1"])
    assert exit_info.value.code == 2
    assert "holds a training run; a demo run never replaces it" in capsys.readouterr().err
    assert sorted(os.listdir(run)) == before
    with pytest.raises(ValueError, match="holds a demo run; a train run never replaces it"):
        demo_dir = tmp_path / "demo"
        RunDirectory.claim(demo_dir, "demo").release()
        RunDirectory.claim(demo_dir, "train", overwrite=True)


def test_a_run_directory_is_locked_while_in_use_and_released_by_a_killed_process(tmp_path):
    out = tmp_path / "run"
    first = RunDirectory.claim(out, "train")
    with pytest.raises(ValueError, match=rf"is in use by another causalqwen run \(pid {os.getpid()}\)"):
        RunDirectory.claim(out, "train", resume=True)
    first.release()
    RunDirectory.claim(out, "train", resume=True).release()

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from causalqwen.files.rundir import RunDirectory; "
            f"held = RunDirectory.claim({str(out)!r}, 'train', resume=True); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by another causalqwen run \(pid {holder.pid}\)"):
            RunDirectory.claim(out, "train", resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunDirectory.claim(out, "train", resume=True).release()  # kill -9 released the lock
    assert {MARKER, LOCK} <= set(os.listdir(out))


# ---------------------------------------------------------------------------------------------
# Resume is strict
# ---------------------------------------------------------------------------------------------


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
    _run_until_first_checkpoint(tokenizer, out, monkeypatch)
    data = _data(tokenizer, seed=change.pop("data_seed", 0))
    config = TrainingConfig(**CONFIG | change | {"log_every": 2, "eval_every": 1})  # logging may change freely
    with pytest.raises(ValueError, match=pattern + ".*pass allow_changed_settings"):
        train(_model(), data, config, out_dir=str(out), resume=True, progress=False)
    history = train(_model(), data, config, out_dir=str(out), resume=True, progress=False, allow_changed_settings=True)
    assert history[-1]["step"] == 4


def test_resume_refuses_a_checkpoint_tensor_of_the_wrong_dtype(tokenizer, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _run_until_first_checkpoint(tokenizer, out, monkeypatch)
    weights = out / "checkpoint-2" / "model.safetensors"
    state = load_file(weights)
    state["action.b_noise"] = torch.full_like(state["action.b_noise"], 10**9, dtype=torch.int32)
    save_file(state, weights)
    with pytest.raises(OSError, match=r"action\.b_noise is stored as I32, but the model's tensor is floating-point"):
        train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out), resume=True, progress=False)
    optimizer_file = out / "checkpoint-2" / "training_state.safetensors"
    state["action.b_noise"] = state["action.b_noise"].float()
    save_file(state, weights)
    tensors = load_file(optimizer_file)
    first = next(key for key in tensors if key.endswith(".exp_avg"))
    tensors[first] = tensors[first][:1]
    save_file(tensors, optimizer_file)
    with pytest.raises(OSError, match=rf"{first} has shape .* the parameter needs"):
        train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out), resume=True, progress=False)


def test_resume_needs_a_run_and_survives_a_metrics_line_cut_short(tokenizer, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="nothing to resume: .* holds no causalqwen run"):
        train(
            _model(),
            _data(tokenizer),
            TrainingConfig(**CONFIG),
            out_dir=str(tmp_path / "none"),
            resume=True,
            progress=False,
        )
    assert not (tmp_path / "none").exists()
    out = tmp_path / "run"
    _run_until_first_checkpoint(tokenizer, out, monkeypatch)
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 3, "train/tot')  # the line a kill -9 cut in half
    train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out), resume=True, progress=False)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    (out / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: not a metrics record"):
        train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out), resume=True, progress=False)


def test_divergence_stops_with_a_clear_error(tokenizer):
    config = TrainingConfig(**CONFIG | {"learning_rate": 1e30, "weight_decay": 0.0, "steps": 6})
    with pytest.raises(TrainingDiverged, match=r"training diverged .* lower the learning rate \(now 1e\+30\)"):
        train(_model(), _data(tokenizer), config, progress=False)


def test_training_on_texts_without_a_next_token_is_refused(tokenizer):
    with pytest.raises(ValueError, match="none of the 8 training texts has two tokens"):
        train(_model(), TextDataset([""] * 8, tokenizer), TrainingConfig(**CONFIG), progress=False)


# ---------------------------------------------------------------------------------------------
# Strict keywords and types at the model's doors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keyword, hint",
    [
        ("numeric_value", "numeric_values"),
        ("attention_masks", "attention_mask"),
        ("label", "labels"),
        ("numeric_label", "numeric_labels"),
    ],
)
def test_misspelt_forward_keywords_are_refused_by_name(tokenizer, keyword, hint):
    model = _model()
    batch = tokenizer(["The price is 12.5 yuan."])
    with pytest.raises(
        TypeError, match=rf"forward\(\) got unexpected keyword argument\(s\) '{keyword}' \(did you mean '{hint}'\?\)"
    ):
        model(batch["input_ids"], numeric_values=batch["numeric_values"], **{keyword: batch["input_ids"]})
    with pytest.raises(TypeError, match=rf"abduce\(\) got unexpected keyword argument\(s\) '{keyword}'"):
        model.abduce(batch["input_ids"], batch["numeric_values"], **{keyword: batch["input_ids"]})


def test_inputs_embeds_gets_a_short_clear_error(tokenizer):
    model = _model()
    with pytest.raises(TypeError) as raised:
        model(torch.tensor([[1, 2]]), inputs_embeds=torch.zeros(1, 2, 64))
    assert "does not take inputs_embeds" in str(raised.value) and len(str(raised.value)) < 200
    assert model(torch.tensor([[1, 2]]), output_hidden_states=True).hidden_states is not None  # passed on


def test_a_num_without_its_value_is_an_error_not_zero(tokenizer):
    model = _model()
    batch = tokenizer(["The price is 12.5 yuan."])
    with pytest.raises(ValueError, match=r"input_ids hold <NUM> .* at position \[0, \d+\] but numeric_values is None"):
        model(batch["input_ids"])
    with pytest.raises(ValueError, match=r"input_ids hold <NUM>"):
        generate(model, batch["input_ids"], max_new_tokens=1)
    words = tokenizer(["The price is yuan."])["input_ids"]
    labels = words.clone()
    labels[0, 2] = tokenizer.num_token_id
    with pytest.raises(ValueError, match="labels hold <NUM> targets but neither numeric_labels nor numeric_values"):
        model(words, labels=labels)


def test_forward_refuses_more_positions_than_the_model_has(tokenizer):
    model = _model()
    limit = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"{limit + 1} positions, more than max_position_embeddings={limit}"):
        model(torch.ones(1, limit + 1, dtype=torch.long))
    left_padded = torch.ones(1, limit + 1, dtype=torch.long)
    mask = torch.ones_like(left_padded)
    mask[0, 0] = 0  # positions count real tokens: exactly the limit
    model(left_padded[:, :8], attention_mask=mask[:, :8])


def test_the_fused_loss_refuses_a_second_derivative(tokenizer):
    torch.manual_seed(0)
    model = _model()
    batch = tokenizer(["A cup of tea costs 1.5 dollars."])
    out = model(**batch, labels=batch["input_ids"])
    with pytest.raises(RuntimeError, match=r"no second derivative .* loss_algorithm='literal'"):
        torch.autograd.grad(out.loss, model.action.b_noise, create_graph=True)
    model.config.loss_algorithm = "literal"  # an explicit choice, not an output flag
    literal = model(**batch, labels=batch["input_ids"])
    (gradient,) = torch.autograd.grad(literal.loss, model.action.b_noise, create_graph=True)
    (second,) = torch.autograd.grad(gradient.sum(), model.action.b_noise)
    assert second.abs().max() > 0  # the literal path has a real Hessian
    U = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    loss = fused_ovr_classification_loss(
        U,
        torch.rand(3, 4, dtype=torch.float64) + 0.5,
        torch.randn(5, 4, dtype=torch.float64),
        torch.zeros(5, dtype=torch.float64),
        torch.full((4,), 0.1, dtype=torch.float64),
        0.0,
        labels=torch.tensor([0, 1, 2]),
    )
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(loss.sum(), U, create_graph=True)


# ---------------------------------------------------------------------------------------------
# Generation keeps predictions whole; numbers of every kind work
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def number_model(tokenizer):
    """A model whose every step predicts <NUM> with value loc_Y = -12345.67 (beyond float16's precision)."""
    model = copy.deepcopy(_model()).eval()
    with torch.no_grad():
        model.action.classification_head.bias[tokenizer.num_token_id] = 1e4
        model.action.regression_head.weight.zero_()
        model.action.regression_head.bias.fill_(-12345.67)
    return model


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (torch.int64, torch.float32),
        (torch.uint8, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_generated_values_are_never_cast_into_a_narrower_type(tokenizer, number_model, dtype, expected):
    batch = tokenizer(["A cup of tea costs 2 dollars"], padding_side="left")
    out = generate(
        number_model, batch["input_ids"], batch["numeric_values"].to(dtype), batch["attention_mask"], max_new_tokens=2
    )
    assert out.numeric_values.dtype == expected
    assert out.numeric_values[0, -1].item() == pytest.approx(-12345.67, rel=1e-6)
    assert out.numeric_values[0, batch["input_ids"].shape[1] - 2].item() == 2.0  # the prompt's number kept


def test_numpy_and_tensor_scalars_work_where_numbers_do(tokenizer, number_model):
    batch = tokenizer(["A cup of tea costs"], padding_side="left")
    args = (number_model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    plain = generate(
        *args,
        mode="traditional",
        max_new_tokens=3,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        generator=torch.Generator().manual_seed(0),
    )
    scalars = generate(
        *args,
        mode="traditional",
        max_new_tokens=np.int64(3),
        temperature=np.float32(0.7),
        top_k=torch.tensor(5),
        top_p=np.float64(0.9),
        eos_token_id=np.int64(0),
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(plain.sequences, scalars.sequences)
    for bad in (True, np.bool_(True), torch.tensor([3]), "3"):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
            generate(*args, max_new_tokens=bad)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_tokens'"):
        generate(*args, max_tokens=3)


def test_a_tiny_temperature_is_greedy_not_an_error():
    loc_S = torch.tensor([[1.0, 3.0, 2.0], [1e30, -1e30, 0.0]])
    for temperature in (1e-45, 1e-30, 1e-6):
        probs = traditional_probabilities(loc_S, temperature=temperature)
        assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    ovr = traditional_probabilities(loc_S, temperature=1e-45, scale_S=torch.ones(2, 3), threshold=0.0, normalize="ovr")
    assert torch.equal(ovr.argmax(-1), torch.tensor([1, 0])) and bool(torch.isfinite(ovr).all())


# ---------------------------------------------------------------------------------------------
# Text and files from outside
# ---------------------------------------------------------------------------------------------


def test_invalid_utf8_and_lone_surrogates_are_named(tokenizer, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9 12"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: invalid UTF-8 at byte 13 of the line \(b'\\xe9 12"):
        read_jsonl(bad)
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "ok"}\n{"text": "ab\\ud800cd 5"}\n')
    texts, sources = read_jsonl(surrogate)
    with pytest.raises(
        ValueError, match=r"surrogate\.jsonl, line 2: character 2 of the text is '\\ud800', a lone surrogate"
    ):
        TextDataset(texts, tokenizer, 16, sources)
    with pytest.raises(ValueError, match=r"text 1: character 0 of the text is '\\udfff', a lone surrogate"):
        tokenizer(["fine", "\udfff"])


def test_a_huge_text_is_encoded_only_as_far_as_max_length_needs(tokenizer):
    words = " ".join(synthetic_texts(4000, seed=3))  # about 180,000 characters
    whole_ids, whole_values = tokenizer.encode(words)
    for max_length in (1, 7, 64, 500):
        ids, values = tokenizer.encode(words, max_length)
        assert ids == whole_ids[:max_length] and values == whole_values[:max_length]
    huge = "The price is 12.5 yuan. " * 2_200_000  # 52.8 million characters
    with pytest.raises(ValueError, match=r"52,800,000 characters, more than the 10,000,000 encoded whole"):
        tokenizer.encode(huge)
    started = time.perf_counter()
    item = TextDataset([huge], tokenizer, max_length=32)[0]
    assert time.perf_counter() - started < budget(10) and len(item["input_ids"]) == 32
    assert item["numeric_values"].tolist().count(12.5) == item["input_ids"].tolist().count(tokenizer.num_token_id) > 0


@pytest.mark.parametrize(
    "text, nearest",
    [
        ("8e-46", "1.4012985e-45"),
        ("1.23456789e-44", "1.2611686e-44"),
        ("-2e-45", "1.4012985e-45"),
        ("1e-45", "1.4012985e-45"),
    ],
)
def test_numbers_that_a_subnormal_float32_would_change_stay_text(tokenizer, text, nearest):
    ids, values = tokenizer.encode(f"x {text} y")
    assert tokenizer.num_token_id not in ids and tokenizer.decode(ids, values) == f"x {text} y"
    with pytest.raises(ValueError, match=rf"underflows float32's normal range .* the subnormal {nearest}, which would"):
        parse_number(text)


@pytest.mark.parametrize("text", ["1.4012985e-45", "-9.999946e-41", "1.5000003e-39", "1.1754942e-38"])
def test_subnormal_numbers_written_as_decode_writes_them_are_kept(tokenizer, text):
    ids, values = tokenizer.encode(text)
    assert ids == [tokenizer.num_token_id] and tokenizer.decode(ids, values) == text
    assert format_number(values[0]) == text  # decode's own text for that value


def test_cli_errors_are_one_line_with_exit_status_2(saved, tmp_path, capsys):
    target = _copy(saved, tmp_path)
    _edit_config(target, vocab_size=10**12)
    NumericTokenizer(build_tiny_base(seed=0)[1]).save_pretrained(target)
    cases = [
        (["demo", "--steps", "0", "--out", str(tmp_path / "d")], "steps must be a positive int, got 0"),
        (["generate", "--model", str(target), "--prompt", "x"], "vocab_size=1000000000000"),
        (["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"], "does not exist"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and message in err[-1], (args, err)
        assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "d").exists()


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


def test_the_loss_algorithm_is_a_named_config_choice():
    from causalqwen import CausalQwenConfig

    with pytest.raises(ValueError, match="config field loss_algorithm must be one of fused, literal, got 'fast'"):
        CausalQwenConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, loss_algorithm="fast")


# ---------------------------------------------------------------------------------------------
# A missing local path never falls through to the hub
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pathlike", "absolute", "dot", "nested", "under_existing_dir"])
def test_a_missing_local_path_is_named_not_looked_up_on_the_hub(tmp_path, monkeypatch, capsys, kind):
    from causalqwen import NumericTokenizer
    from causalqwen.app.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    source = {
        "pathlike": tmp_path / "missing",
        "absolute": str(tmp_path / "missing"),
        "dot": "./missing",
        "nested": "a/b/missing",
        "under_existing_dir": "runs/missing",
    }[kind]
    started = time.perf_counter()
    for load, what in [
        (CausalQwenForCausalLM.from_pretrained, "model"),
        (CausalQwenForCausalLM.from_qwen, "base model"),
        (NumericTokenizer.from_pretrained, "tokenizer"),
    ]:
        with pytest.raises(OSError, match=f"{what} directory '{re.escape(str(source))}' does not exist"):
            load(source)
    with pytest.raises(SystemExit) as exited:
        cli_main(["generate", "--model", str(source), "--prompt", "x"])
    assert exited.value.code == 2 and f"model directory '{source}' does not exist" in capsys.readouterr().err
    assert time.perf_counter() - started < budget(5)  # no network retries
