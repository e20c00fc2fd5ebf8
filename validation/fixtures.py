"""What the experiments and the robustness tables start from: data, the tiny model, scratch files, short runs.

The experiments start from ``n`` sentences of the synthetic corpus, collated (`sentence_batch`); the
model they start from is `causalqwen.app.tiny.build_tiny_causal_lm` (the embedded tiny base,
converted); ``init_seed`` fixes its random w_num and w_reg.

The robustness suite and the trust-boundary tables (`validation.robustness`, `validation.trust`, ...)
share the fixtures below: one cached tiny model (`shared_tiny`), fresh ones (`fresh_tiny_model`), a
scratch directory removed at exit (`scratch_dir`, `fresh_dir`), a saved model, a two-step training run
(`train_tiny`) and the edits the tables make to files. Everything is built on first use, so importing
this module costs nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import tempfile
from typing import Callable, NamedTuple

import torch

from causalqwen import NumericTokenizer
from causalqwen.files.data import TextDataset, collate, synthetic_texts

__all__ = [
    "sentence_batch",
    "quiet_transformers",
    "scratch_dir",
    "fresh_dir",
    "Tiny",
    "shared_tiny",
    "ids_with_num",
    "short_prompt",
    "fresh_tiny_model",
    "tiny_dataset",
    "TINY_RUN",
    "train_tiny",
    "finished_run",
    "saved_tiny_model",
    "edit_json",
    "load_edited_config",
    "load_config_fields",
    "encoded_batch",
    "jsonl_file",
    "model_generate_trigger",
    "numeric_pipeline",
]


def sentence_batch(tokenizer: NumericTokenizer, n: int, seed: int) -> dict[str, torch.Tensor]:
    """``n`` sentences of the synthetic corpus (`causalqwen.files.data`), collated (right padding, labels)."""
    return collate(TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=64).items, tokenizer.pad_token_id)


# =============================================================================================
# Quiet transformers, scratch directories
# =============================================================================================


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' warnings and progress bars for the duration (restored afterwards)."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()


@functools.cache
def scratch_dir() -> str:
    """A temporary directory for saved checkpoints, removed when the process exits."""
    path = tempfile.mkdtemp(prefix="causalqwen-robustness-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def fresh_dir(name: str) -> str:
    """A new, empty directory ``name-XXXX`` under `scratch_dir` (one per case, so cases never share files)."""
    return tempfile.mkdtemp(prefix=name + "-", dir=scratch_dir())


# =============================================================================================
# The tiny model: one shared (cached), or fresh ones
# =============================================================================================


class Tiny(NamedTuple):
    """The embedded tiny Qwen2 base, its `NumericTokenizer`, and CausalQwen converted from it (eval mode)."""

    qwen: object
    tokenizer: NumericTokenizer
    model: object


@functools.cache
def shared_tiny() -> Tiny:
    """The `Tiny` fixture every case shares (built once; the global torch random state is left as it was).

    A case that changes the model works on a copy (``copy.deepcopy``) or on `fresh_tiny_model`.
    """
    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, qwen = build_tiny_causal_lm(seed=0, init_seed=0)
    return Tiny(qwen, tokenizer, model)


def ids_with_num(*rows) -> torch.Tensor:
    """A ``[B, S]`` id tensor from rows of ids, where ``None`` stands for ``<NUM>``."""
    num_id = shared_tiny().tokenizer.num_token_id
    return torch.tensor([[num_id if i is None else i for i in row] for row in rows])


def short_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, numeric_values)`` of one short prompt ``[1, 3]`` holding one ``<NUM>`` = 12.5."""
    return ids_with_num([11, None, 23]), torch.tensor([[0.0, 12.5, 0.0]])


def fresh_tiny_model(**overrides):
    """A new tiny CausalQwen (the shared one's weights; ``overrides`` go to its config)."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    return build_tiny_causal_lm(seed=0, init_seed=0, **overrides).model


def encoded_batch(text: str = "The total is 5"):
    """``(tokenizer, batch)``: the shared tokenizer and ``text`` encoded with left padding."""
    tokenizer = shared_tiny().tokenizer
    return tokenizer, tokenizer([text], padding_side="left")


def model_generate_trigger(**arguments) -> Callable[[], None]:
    """A trigger: ``model.generate`` of the shared model on `encoded_batch`, one new token, with ``arguments``
    (a callable argument is called with the batch: ``numeric_values=lambda batch: ...``)."""

    def trigger():
        _, batch = encoded_batch()
        call = dict(numeric_values=batch["numeric_values"], attention_mask=batch["attention_mask"], max_new_tokens=1)
        call.update({key: value(batch) if callable(value) else value for key, value in arguments.items()})
        shared_tiny().model.generate(batch["input_ids"], **call)

    return trigger


def numeric_pipeline(model=None, tokenizer=None):
    """transformers' ``pipeline("text-generation")`` as a `NumericTextGenerationPipeline` (the shared model and
    tokenizer unless given)."""
    from transformers import pipeline

    from causalqwen.integrations.pipelines import NumericTextGenerationPipeline

    return pipeline(
        "text-generation",
        model=model if model is not None else shared_tiny().model,
        tokenizer=tokenizer if tokenizer is not None else shared_tiny().tokenizer,
        pipeline_class=NumericTextGenerationPipeline,
    )


# =============================================================================================
# Short training runs and saved files
# =============================================================================================


def tiny_dataset(n: int = 16, seed: int = 0):
    """``n`` synthetic texts as a `TextDataset` of the shared tokenizer (24 tokens at most)."""
    return TextDataset(synthetic_texts(n, seed=seed), shared_tiny().tokenizer, max_length=24)


TINY_RUN = dict(
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


def train_tiny(out: str | None, resume: bool = False, overwrite: bool = False, data=None, **changes):
    """`causalqwen.train` of a fresh tiny model with `TINY_RUN` (``changes`` override its settings);
    the global torch random state is left as it was."""
    from causalqwen import train
    from causalqwen.training import TrainingConfig

    with torch.random.fork_rng(devices=[]):
        return train(
            fresh_tiny_model(),
            data if data is not None else tiny_dataset(),
            TrainingConfig(**TINY_RUN | changes),
            out_dir=out,
            resume=resume,
            overwrite=overwrite,
            progress=False,
        )


def finished_run(steps: int = 4, **changes) -> str:
    """A training run of ``steps`` steps saved every 2 steps, its last checkpoint removed (as if killed)."""
    out = os.path.join(fresh_dir("run"), "run")
    train_tiny(out, steps=steps, save_every=2, **changes)
    shutil.rmtree(os.path.join(out, f"checkpoint-{steps}"))
    return out


def saved_tiny_model() -> str:
    """A fresh copy of the tiny CausalQwen saved with save_pretrained (model and tokenizer)."""
    path = os.path.join(fresh_dir("saved"), "model")
    fresh_tiny_model().save_pretrained(path)
    shared_tiny().tokenizer.save_pretrained(path)
    return path


def edit_json(file: str, edit: Callable[[dict], object]) -> None:
    """Read the JSON object in ``file``, let ``edit`` change it in place, and write it back."""
    with open(file, encoding="utf-8") as handle:
        content = json.load(handle)
    edit(content)
    with open(file, "w", encoding="utf-8") as handle:
        json.dump(content, handle)


def load_edited_config(edit: Callable[[dict], object]) -> Callable[[], None]:
    """A trigger: ``from_pretrained`` of a `saved_tiny_model` whose ``config.json`` ``edit`` changed in place."""

    def trigger():
        from causalqwen import CausalQwenForCausalLM

        path = saved_tiny_model()
        edit_json(os.path.join(path, "config.json"), edit)
        CausalQwenForCausalLM.from_pretrained(path)

    return trigger


def load_config_fields(**fields) -> Callable[[], None]:
    """`load_edited_config` with ``fields`` written into ``config.json``."""
    return load_edited_config(lambda config: config.update(fields))


def jsonl_file(name: str, content: bytes) -> str:
    """A new file ``name`` holding ``content`` (bytes as given), in a fresh directory."""
    path = os.path.join(fresh_dir("jsonl"), name)
    with open(path, "wb") as handle:
        handle.write(content)
    return path
