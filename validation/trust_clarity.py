"""Trust boundaries (issue 14), the clarity rows: inputs that used to fail with a message that named nothing.

Invalid UTF-8 and lone surrogates in a data file, a config field of the wrong type, a missing
tokenizer, a metrics line cut short by a kill, a divergent learning rate, NumPy scalars and a tiny
temperature in generation, ``inputs_embeds``. `CLARITY_CASES` is the last group of
`validation.trust.TRUST_CASES` (the same `TrustCase` rows, judged by `validation.cases.run_trust_case`).
"""

from __future__ import annotations

import os
import shutil

import torch

from .cases import TrustCase, WrongResult, command_line_refusal, run_cli
from .fixtures import (
    fresh_dir,
    load_config_fields,
    saved_tiny_model,
    shared_tiny,
    train_tiny,
)

__all__ = ["CLARITY_CASES"]


def _invalid_utf8():
    from causalqwen.files.data import read_jsonl

    path = os.path.join(fresh_dir("utf8"), "data.jsonl")
    with open(path, "wb") as handle:
        handle.write(b'{"text": "fine"}\n{"text": "caf\xe9 12"}\n')
    read_jsonl(path)


def _lone_surrogate():
    from causalqwen.files.data import TextDataset, read_jsonl

    path = os.path.join(fresh_dir("surrogate"), "data.jsonl")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"text": "ok"}\n{"text": "ab\\ud800cd 5"}\n')
    texts, sources = read_jsonl(path)
    TextDataset(texts, shared_tiny().tokenizer, 16, sources)


def _missing_tokenizer():
    path = saved_tiny_model()
    for name in os.listdir(path):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "added_tokens")):
            os.remove(os.path.join(path, name))
    run_cli(["generate", "--model", path, "--prompt", "hi", "--max-new-tokens", "1"])


def _truncated_metrics_line():
    from causalqwen.files.runs import latest_checkpoint

    out = os.path.join(fresh_dir("metrics-cut"), "run")
    train_tiny(out, steps=4, save_every=2)
    shutil.rmtree(os.path.join(out, "checkpoint-4"))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        lines = handle.readlines()
    with open(os.path.join(out, "metrics.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(lines[:3])
        handle.write(lines[3][:10])  # the line a kill -9 cut in half
    train_tiny(out, resume=True, steps=4, save_every=2)
    if not latest_checkpoint(out).endswith("checkpoint-4"):
        raise WrongResult("the resumed run did not finish")


def _divergence():
    train_tiny(None, steps=6, learning_rate=1e30, weight_decay=0.0)  # no decay: 1e30 * 0.01 >= 1 is refused up front


def _numpy_scalars():
    import numpy as np

    from causalqwen import generate

    batch = shared_tiny().tokenizer(["A cup of tea costs"], padding_side="left")
    generate(shared_tiny().model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], mode="traditional",
             max_new_tokens=np.int64(2), temperature=np.float32(0.7), top_k=torch.tensor(5), top_p=np.float64(0.9),
             generator=torch.Generator().manual_seed(0))


def _tiny_temperature():
    from causalqwen.inference import traditional_probabilities

    probs = traditional_probabilities(torch.tensor([[1.0, 3.0, 2.0]]), temperature=1e-45)
    if not torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0]])):
        raise WrongResult(f"expected the greedy distribution, got {probs.tolist()}")


def _inputs_embeds():
    shared_tiny().model(torch.tensor([[1, 2]]), inputs_embeds=torch.zeros(1, 2, shared_tiny().model.config.hidden_size))


CLARITY_CASES = [
    # ---- clarity
    TrustCase("jsonl-invalid-utf8", "clarity", "a JSONL line with a Latin-1 byte", _invalid_utf8, ValueError,
              r"data\.jsonl, line 2: invalid UTF-8 at byte 13 of the line"),
    TrustCase("jsonl-lone-surrogate", "clarity", 'a JSONL text holding "\\ud800"', _lone_surrogate, ValueError,
              r"data\.jsonl, line 2: character 2 of the text is '\\ud800', a lone surrogate"),
    TrustCase("config-field-wrong-type", "clarity", 'config.json with "ovr_threshold": "100" (was a comparison TypeError)',
              load_config_fields(ovr_threshold="100"), ValueError, r"config\.json: config field ovr_threshold must be a number, got '100'"),
    command_line_refusal("tokenizer-files-missing", "clarity", "generate --model on a directory without its tokenizer files",
                         _missing_tokenizer, r".*cannot load a tokenizer from '.*model'"),
    TrustCase("metrics-line-cut-short", "clarity", "resume after a kill cut the last line of metrics.jsonl in half",
              _truncated_metrics_line, None),
    TrustCase("learning-rate-1e30", "clarity", "training with learning rate 1e30 (surfaced as 'scale_U must be >= 0')",
              _divergence, WrongResult, r"training diverged .*lower the learning rate"),  # TrainingDiverged, set below
    TrustCase("generate-numpy-scalars", "clarity", "generate with NumPy and 0-d tensor scalars for its numbers",
              _numpy_scalars, None),
    TrustCase("temperature-1e-45", "clarity", "traditional sampling at temperature 1e-45 (a raw RuntimeError)",
              _tiny_temperature, None),
    TrustCase("forward-inputs-embeds", "clarity", "forward(inputs_embeds=...) (a 999-character error)",
              _inputs_embeds, TypeError, r"^forward\(\) does not take inputs_embeds: CausalQwen forms the embeddings itself"),
]


def _resolve_diverged() -> None:
    """The divergence row expects `causalqwen.training.TrainingDiverged` (looked up late, so that this table
    can also be run against a version of the package that does not have it: the row then fails)."""
    try:
        from causalqwen.training import TrainingDiverged
    except ImportError:
        return
    for index, case in enumerate(CLARITY_CASES):
        if case.id == "learning-rate-1e30":
            CLARITY_CASES[index] = TrustCase(case.id, case.group, case.description, case.trigger, TrainingDiverged,
                                           case.message)


_resolve_diverged()
