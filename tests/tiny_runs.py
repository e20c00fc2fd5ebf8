"""The tiny CausalQwen, the texts it trains on and the short runs that the training and file tests share.

`tiny_model` is `causalqwen.app.tiny.build_tiny_causal_lm` with seed 0 (its tokenizer is the one of the conftest
fixtures ``tiny`` and ``tokenizer``: the same tokenizer); `TWO_STEP_RUN` and `FOUR_STEP_RUN` are the settings of a
run that saves a checkpoint every two steps. The conftest fixture ``finished_run`` is a finished `TWO_STEP_RUN`;
`run_copy` gives a test its own copy of it and `resume` resumes that copy for two more steps. `outside_file` is a
file outside every directory a run writes, holding `SECRET`, for the tests that plant links to it. The conftest
fixture ``saved`` is the tiny model saved with ``save_pretrained``: `saved_copy` gives a test its own copy of it and
`edit_config` rewrites fields of a copy's config; `file_tree` reads everything under a directory.
"""

import json
import os
import shutil

import pytest
from safetensors.torch import load_file, save_file

from causalqwen import train
from causalqwen.app import runs
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.training import TrainingConfig


def tiny_model(**overrides):
    """The tiny CausalQwen (its tokenizer is the conftest fixture `tokenizer`: the same tokenizer)."""
    return build_tiny_causal_lm(seed=0, init_seed=0, **overrides).model


def tiny_data(tokenizer, n=24, seed=0):
    """``n`` synthetic texts (seeded), tokenized to at most 32 tokens."""
    return TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=32)


TWO_STEP_RUN = dict(
    steps=2,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=1,
    preset="all",
    eval_every=2,
    save_every=2,
    log_every=1,
    seed=0,
)
FOUR_STEP_RUN = TWO_STEP_RUN | {"steps": 4}


def run_copy(finished_run, tmp_path):
    """A copy of the run directory ``finished_run`` under ``tmp_path``, links copied as links."""
    target = tmp_path / "run"
    shutil.copytree(finished_run, target, symlinks=True)
    return target


def saved_copy(saved, tmp_path, name="copy"):
    """A copy of the saved model directory ``saved`` named ``name`` under ``tmp_path``."""
    target = tmp_path / name
    shutil.copytree(saved, target)
    return target


def edit_config(path, **fields):
    """Set ``fields`` in the ``config.json`` of the model directory ``path``."""
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    (path / "config.json").write_text(json.dumps(config))


def resume(tokenizer, out, **overrides):
    """Resume the run in ``out`` (the divergence bound on) to step 4 unless ``overrides`` say otherwise, changed
    settings allowed."""
    config = TrainingConfig(**TWO_STEP_RUN | {"max_u_divergence": 1.0, "steps": 4} | overrides)
    return train(
        tiny_model(),
        tiny_data(tokenizer),
        config,
        out_dir=str(out),
        resume=True,
        progress=False,
        allow_changed_settings=True,
    )


def run_until_first_checkpoint(tokenizer, out, monkeypatch, **overrides):
    """A run killed right after its step-2 checkpoint."""
    save = runs.save_checkpoint

    def save_then_die(*args, **kwargs):
        save(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(
            tiny_model(),
            tiny_data(tokenizer),
            TrainingConfig(**FOUR_STEP_RUN | overrides),
            out_dir=str(out),
            progress=False,
        )
    monkeypatch.setattr(runs, "save_checkpoint", save)


SECRET = "a file outside the run directory\n"


def outside_file(tmp_path, name="secret.txt"):
    """A file outside every directory the tests write into, with known content."""
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir(exist_ok=True)
    target.write_text(SECRET)
    return target


def with_tensor(file, name, value):
    """Rewrite one tensor of the safetensors ``file`` (its metadata kept)."""
    from safetensors import safe_open

    with safe_open(file, framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(file)
    tensors[name] = value(tensors[name])
    save_file(tensors, file, metadata=metadata)


def file_tree(path):
    """``{relative path: bytes, or the link's target}`` of everything under ``path``, links not followed."""
    found = {}
    for root, directories, files in os.walk(path):
        for name in directories + files:
            full = os.path.join(root, name)
            key = os.path.relpath(full, path)
            if os.path.islink(full):
                found[key] = "-> " + os.readlink(full)
            elif os.path.isfile(full):
                with open(full, "rb") as handle:
                    found[key] = handle.read()
            else:
                found[key] = "dir"
    return found
