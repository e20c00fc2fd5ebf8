r"""The tiny Qwen2 base pretrained on domain A, and the two corpora, for the Qwen2-vs-CausalQwen comparison.

Domain A, general English text without any number, is `validation.domain_a` (`domain_a_texts`); domain B,
text with numbers that are partly predictable from the context, is `validation.domain_b` (`domain_b_records`,
`domain_b_texts`); both are importable from here. The batches of a Qwen2 model are `validation.qwen_batches`.

**The pretrained base** (`pretrained_base`) is the embedded tiny Qwen2 (`causalqwen.app.tiny.build_tiny_base`,
tied embeddings, as built) trained briefly on domain A with plain next-token cross-entropy by a literal
AdamW loop, cached on disk keyed by a hash of every setting, and `pretrain_loss_a` is its held-out loss.
Its batches come from `validation.qwen_batches.batch_order`, the batch order every training loop of
the comparison uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM, get_cosine_schedule_with_warmup
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
from transformers.utils import logging as hf_logging

from causalqwen.app.tiny import build_tiny_base

from .argument_checks import check_seed
from .domain_a import domain_a_texts
from .domain_b import (
    DEFAULT_EXTRAPOLATION_RANGE,
    DEFAULT_VALUE_RANGE,
    ITEM_QUANTILES,
    OUTLIER_FACTOR_CAP,
    OUTLIER_FACTOR_MIN,
    TEMPLATES,
    DomainBNumber,
    DomainBRecord,
    domain_b_records,
    domain_b_texts,
    item_means,
)
from .qwen_batches import batch_order, collate_rows, encode_qwen_rows, next_token_loss

__all__ = [
    "DOMAINS_VERSION",
    "ITEM_QUANTILES",
    "DEFAULT_VALUE_RANGE",
    "DEFAULT_EXTRAPOLATION_RANGE",
    "OUTLIER_FACTOR_MIN",
    "OUTLIER_FACTOR_CAP",
    "DomainBNumber",
    "DomainBRecord",
    "TEMPLATES",
    "HELD_OUT_SEED_OFFSET",
    "domain_b_records",
    "domain_b_texts",
    "item_means",
    "PretrainSettings",
    "pretrained_base",
    "pretrained_base_path",
    "pretrained_numeric_tokenizer",
    "pretrained_starting_point",
    "pretrain_record",
    "pretrain_loss_a",
    "PRETRAIN_COUNTS",
    "default_cache_dir",
]

# Part of every cache key: bump it whenever the corpora (`validation.domain_a` included), the pretraining loop or
# the saved format change.
DOMAINS_VERSION = 1


# ---------------------------------------------------------------------------------------------
# The held-out loss of a Qwen2 model on domain-A text
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def pretrain_loss_a(model, tokenizer, texts: list[str], batch_size: int = 64) -> float:
    """Mean next-token cross-entropy (nats per token, EOS appended, every token scored) of a Qwen-style model
    (anything whose forward takes ``input_ids``, ``attention_mask`` and returns ``.logits``) on ``texts``."""
    was_training = model.training
    model.eval()
    rows = encode_qwen_rows(tokenizer, texts)
    total, count = 0.0, 0
    try:
        for start in range(0, len(rows), batch_size):
            batch = collate_rows(rows[start : start + batch_size], tokenizer.pad_token_id)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            total += float(next_token_loss(logits, batch["labels"], reduction="sum"))
            count += int((batch["labels"][:, 1:] != -100).sum())
    finally:
        model.train(was_training)
    return total / count


# ---------------------------------------------------------------------------------------------
# The pretrained base, cached on disk
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PretrainSettings:
    """Everything that decides the pretrained base (all of it goes into the cache key)."""

    steps: int = 300
    seed: int = 0
    n_texts: int = 4000
    batch_size: int = 16
    learning_rate: float = 5e-3
    warmup_steps: int = 15
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    n_held_out: int = 200


# how many times this process trained a base, and loaded one from the cache (tests read it)
PRETRAIN_COUNTS: Counter = Counter()
HELD_OUT_SEED_OFFSET = 1_000_003  # the held-out domain-A texts use seed + this


def default_cache_dir() -> Path:
    """``$CAUSALQWEN_CACHE`` if set, else ``~/.cache/causalqwen``."""
    return Path(os.environ.get("CAUSALQWEN_CACHE") or Path.home() / ".cache" / "causalqwen")


def _cache_key(settings: PretrainSettings) -> str:
    corpus = "\n".join(domain_a_texts(settings.n_texts, settings.seed))
    payload = json.dumps(
        {
            "version": DOMAINS_VERSION,
            "settings": asdict(settings),
            "corpus_sha256": hashlib.sha256(corpus.encode()).hexdigest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def pretrained_base_path(cache_dir=None, **settings) -> Path:
    """The cache directory for the base of these settings (it may not exist yet)."""
    resolved = PretrainSettings(**settings)
    return Path(cache_dir if cache_dir is not None else default_cache_dir()) / f"pretrained-base-{_cache_key(resolved)}"


def pretrain_record(cache_dir=None, **settings) -> dict:
    """The ``pretrain_record.json`` of a cached base: settings, losses (held-out before / after, training
    loss every 10 steps), seconds. A ``FileNotFoundError`` if the base was never built."""
    return json.loads((pretrained_base_path(cache_dir, **settings) / "pretrain_record.json").read_text())


def _pretrain(settings: PretrainSettings) -> tuple[Qwen2ForCausalLM, Qwen2Tokenizer, dict]:
    """Build the tiny base (seed = settings.seed) and train it on domain A; the model, tokenizer and record."""
    started = time.perf_counter()
    model, tokenizer = build_tiny_base(seed=settings.seed)
    texts = domain_a_texts(settings.n_texts, settings.seed)
    held_out = domain_a_texts(settings.n_held_out, settings.seed + HELD_OUT_SEED_OFFSET)
    rows = encode_qwen_rows(tokenizer, texts)
    loss_before = pretrain_loss_a(model, tokenizer, held_out)
    parameters = list(model.parameters())  # the tied embedding appears once
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": settings.weight_decay},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=settings.learning_rate,
    )
    scheduler = get_cosine_schedule_with_warmup(optimizer, settings.warmup_steps, settings.steps)
    trajectory = []
    model.train()
    for step, indices in enumerate(batch_order(len(rows), settings.batch_size, settings.steps, settings.seed), 1):
        batch = collate_rows([rows[i] for i in indices], tokenizer.pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = next_token_loss(logits, batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, settings.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == 1:
            trajectory.append([step, loss.item()])
    model.eval()
    loss_after = pretrain_loss_a(model, tokenizer, held_out)
    PRETRAIN_COUNTS["trained"] += 1
    record = {
        "settings": asdict(settings),
        "version": DOMAINS_VERSION,
        "held_out_loss_before": loss_before,
        "held_out_loss_after": loss_after,
        "train_loss": trajectory,
        "seconds": time.perf_counter() - started,
        "torch_threads": torch.get_num_threads(),
    }
    return model, tokenizer, record


@contextlib.contextmanager
def _quiet_progress():
    """transformers' progress bars off for a moment (saving and loading a 0.5 MB model), then as they were."""
    was_disabled = hf_logging.is_progress_bar_enabled() is False
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not was_disabled:
            hf_logging.enable_progress_bar()


def pretrained_base(
    steps: int = PretrainSettings.steps, seed: int = 0, cache_dir=None, **settings
) -> tuple[Qwen2ForCausalLM, Qwen2Tokenizer]:
    """The tiny Qwen2 base pretrained on domain A: ``(model, tokenizer)``, fresh objects on every call.

    The first call for some settings (`PretrainSettings`: ``steps``, ``seed`` and the others as keywords)
    trains it (`_pretrain`: `build_tiny_base` (seed), ``n_texts`` domain-A texts (seed), AdamW with weight
    decay on matrices only, linear warm-up then cosine decay, gradient clipping, batches by `batch_order`)
    and saves model (safetensors), tokenizer and ``pretrain_record.json`` into a temporary directory under
    ``cache_dir`` (default `default_cache_dir`), which is then renamed to `pretrained_base_path` in one step.
    Every call (the first too) loads the model and tokenizer from that directory with local files only, so
    every call returns the same weights, bit for bit. Deterministic per seed (on one machine, one thread count).
    Nothing is ever deleted except this call's own temporary directory.
    """
    resolved = PretrainSettings(steps=steps, seed=seed, **settings)
    if isinstance(resolved.steps, bool) or not isinstance(resolved.steps, int) or resolved.steps < 1:
        raise ValueError(f"steps must be a positive int, got {resolved.steps!r}")
    check_seed(resolved.seed)
    if resolved.seed < 0:
        raise ValueError(f"seed must be non-negative, got {resolved.seed}")
    root = Path(cache_dir if cache_dir is not None else default_cache_dir())
    final = root / f"pretrained-base-{_cache_key(resolved)}"
    if not final.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        # Pretraining needs gradients even when the first caller evaluates under no_grad or inference_mode.
        with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
            torch.manual_seed(resolved.seed)
            model, tokenizer, record = _pretrain(resolved)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-pretrained-base-", dir=root))
        try:
            with _quiet_progress():
                model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            (staging / "pretrain_record.json").write_text(json.dumps(record, indent=1))
            staging.chmod(0o755)  # mkdtemp makes it private; the renamed cache entry is an ordinary directory
            try:
                os.rename(staging, final)
            except OSError:
                if not final.is_dir():  # not a lost race with another process: a real failure
                    raise
        finally:
            if staging.exists():  # our own temporary directory (a lost race, or a failure)
                shutil.rmtree(staging)
    else:
        PRETRAIN_COUNTS["loaded"] += 1
    with _quiet_progress():
        model = Qwen2ForCausalLM.from_pretrained(final, local_files_only=True, dtype=torch.float32).eval()
    tokenizer = Qwen2Tokenizer.from_pretrained(final, local_files_only=True)
    return model, tokenizer


def pretrained_numeric_tokenizer(**settings):
    """A `causalqwen.NumericTokenizer` around its own copy of the pretrained base's tokenizer (`pretrained_base`
    with ``settings``; adding ``<NUM>`` changes the tokenizer it wraps, so the base's own stays plain)."""
    from causalqwen import NumericTokenizer

    pretrained_base(**settings)  # build the cache entry if this is the first call
    return NumericTokenizer(Qwen2Tokenizer.from_pretrained(pretrained_base_path(**settings), local_files_only=True))


def pretrained_starting_point(**settings):
    """``(base, qwen_tokenizer, numeric_tokenizer)``: `pretrained_base` and `pretrained_numeric_tokenizer` with the
    same ``settings``, what the fine-tuning experiments (V9, V10, V11) start from."""
    base, qwen_tokenizer = pretrained_base(**settings)
    return base, qwen_tokenizer, pretrained_numeric_tokenizer(**settings)
