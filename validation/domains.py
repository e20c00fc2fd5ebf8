r"""Domain B and the tiny Qwen2 base pretrained on domain A, for the Qwen2-vs-CausalQwen comparison.

Domain A, general English text without any number, is `validation.domain_a` (`domain_a_texts`); the batches
of a Qwen2 model are `validation.qwen_batches`.

**Domain B** (`domain_b_records`, `domain_b_texts`) is text with numbers that are partly predictable from the
context. Each text is one instance of one of three templates (chosen uniformly; a few phrasings each):

| template | example | the number to be predicted (role ``"target"``) |
|---|---|---|
| ``price`` | ``At the market, a lamp costs 12.4 dollars.`` | the price: the item's mean $m_i$ times $e^{0.1\varepsilon}$, $\varepsilon \sim N(0, 1)$, one decimal |
| ``copy`` | ``The train to the city takes 37 minutes, and the train back also takes 37 minutes.`` | the second number repeats the first |
| ``scaled`` | ``One box holds 23 pens, so two boxes hold 46 pens.`` | the second number is twice the first |

The first number of ``copy`` and ``scaled`` (role ``"given"``) is a uniform draw the model cannot predict.
With ``value_range = (lo, hi)`` (default ``(1, 99)``): item means $m_i = lo\,(hi/lo)^{q_i}$ with fixed
$q_i \in [0.15, 0.85]$ (prices are clipped to $[lo, hi]$ and written with one decimal); ``copy`` draws an
integer in $[\lceil lo\rceil, \lfloor hi\rfloor]$, ``scaled`` an integer $x \in [\lceil lo\rceil, \lfloor hi/2\rfloor]$ (so $2x \le hi$).
Every number is followed by a space and a unit word and preceded by a space, so the project's number
grammar (`causalqwen.numbers`) reads exactly the generated numbers, with exactly their values.

*Outliers* (``outlier_fraction = f``): each target number independently, with probability $f$, is replaced by
$v \cdot F$ with $F = \min(2/U,\ 10^4)$, $U \sim \mathrm{Uniform}(0, 1]$ — a Pareto factor with tail index 1
and minimum 2 ($P(F > t) = 2/t$ for $2 \le t < 10^4$: infinite mean), rounded to the template's format.
Outliers come from their own random stream, so the same seed with different $f$ gives the same texts except
at the replaced numbers. The record marks each replaced number (``outlier=True``, ``base_value`` = the value
before the factor).

*Extrapolation* (``extrapolate=True``): every number lies in ``extrapolation_range`` (default ``(200, 5000)``),
which must lie entirely above ``value_range``: ``copy`` draws $x \in [200, 5000]$, ``scaled`` $x \in [200, 2500]$
(so $2x \in [400, 5000]$), written as plain integers. The ``price`` template is left out of extrapolation
corpora: its value is a fixed function of the item word, so there is no relation to extrapolate.

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
import math
import os
import random
import shutil
import string
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import regex
import torch
from transformers import Qwen2ForCausalLM, get_cosine_schedule_with_warmup
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
from transformers.utils import logging as hf_logging

from causalqwen.app.tiny import build_tiny_base
from causalqwen.numbers import parse_number

from .argument_checks import check_count, check_seed
from .domain_a import ANIMALS, PLACES, domain_a_texts
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
# Domain B: text with numbers
# ---------------------------------------------------------------------------------------------

_ARTICLE_END = regex.compile(r"\b([Aa]) $")

DEFAULT_VALUE_RANGE = (1, 99)
DEFAULT_EXTRAPOLATION_RANGE = (200, 5000)
OUTLIER_FACTOR_MIN = 2.0  # F = OUTLIER_FACTOR_MIN / U, U ~ Uniform(0, 1]: Pareto with tail index 1
OUTLIER_FACTOR_CAP = 1e4  # F is capped here (keeps every value a quantity of the grammar, < 1e7)
PRICE_NOISE = 0.1  # the price is mean * exp(PRICE_NOISE * N(0, 1))

# item -> q: its mean price is lo * (hi / lo) ** q (log-spaced over the value range)
ITEM_QUANTILES = {
    "apple": 0.15,
    "bread": 0.25,
    "book": 0.35,
    "shirt": 0.45,
    "lamp": 0.55,
    "chair": 0.65,
    "coat": 0.75,
    "bicycle": 0.85,
}
_PRICE_PHRASES = (
    "At the market, a {item} costs {p} dollars.",
    "The price of a {item} is {p} dollars.",
    "Today a {item} costs {p} dollars.",
)
_COPY_PHRASES = (
    "The train to the {place} takes {x} minutes, and the train back also takes {y} minutes.",
    "The {animal} walked {x} meters to the {place}, then walked {y} meters back.",
    "We paid {x} dollars for the room, and they paid the same {y} dollars.",
)
_SCALED_PHRASES = (
    "One box holds {x} pens, so two boxes hold {y} pens.",
    "One bag weighs {x} grams, so two bags weigh {y} grams.",
    "A trip takes {x} minutes, so two trips take {y} minutes.",
)
TEMPLATES = ("price", "copy", "scaled")


@dataclass(frozen=True)
class DomainBNumber:
    """One number of a domain-B text: its character span ``[start, end)`` in the text, its text, its value
    (the grammar's float32 value of the text), its role (``"given"`` or ``"target"``), whether it is an
    outlier, and the value before the outlier factor (= ``value`` when it is not an outlier)."""

    start: int
    end: int
    text: str
    value: float
    role: str
    outlier: bool = False
    base_value: float | None = None


@dataclass(frozen=True)
class DomainBRecord:
    """A domain-B text, the template it came from, and its numbers in order."""

    text: str
    template: str
    numbers: tuple[DomainBNumber, ...]


def item_means(value_range=DEFAULT_VALUE_RANGE) -> dict[str, float]:
    """The mean price of every item for ``value_range = (lo, hi)``: ``lo * (hi / lo) ** q_item``."""
    lo, hi = _check_range(value_range, "value_range")
    return {item: lo * (hi / lo) ** q for item, q in ITEM_QUANTILES.items()}


def _check_range(value_range, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair (lo, hi) of numbers, got {value_range!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo and hi >= 2 * lo and hi < 1e6):
        raise ValueError(f"{name} must satisfy 0 < lo, 2 lo <= hi < 1e6, got {value_range!r}")
    return lo, hi


def _fill(phrase: str, rng: random.Random, strings: dict) -> tuple[str, list[tuple[int, int, str]]]:
    """``phrase`` formatted with the number strings ``strings`` (keys ``x``, ``y``, ``p``) and random words;
    returns the text and the spans of the numbers, in order of appearance, with their keys."""
    words = {"place": rng.choice(sorted(PLACES)), "animal": rng.choice(sorted(ANIMALS)), **strings.pop("_words", {})}
    text, spans = "", []
    for literal, field, _, _ in string.Formatter().parse(phrase):  # the fields in order: exact spans
        text += literal
        if field is None:
            continue
        if field in strings:
            spans.append((len(text), len(text) + len(strings[field]), field))
            text += strings[field]
        else:
            if words[field][:1] in "aeiou":
                text = _ARTICLE_END.sub(r"\1n ", text)  # "a apple" -> "an apple"
            text += words[field]
    return text, spans


def _price_text(value: float) -> str:
    return f"{value:.1f}"


def _int_text(value: float) -> str:
    return str(round(value))


def _outlier(value: float, rng_out: random.Random, fraction: float) -> tuple[float, bool]:
    """One Bernoulli(fraction) draw and one factor draw, always both (so the stream does not depend on the
    outcome); returns the possibly replaced value and whether it was replaced."""
    hit = rng_out.random() < fraction
    factor = min(OUTLIER_FACTOR_MIN / (1.0 - rng_out.random()), OUTLIER_FACTOR_CAP)  # 1 - random() in (0, 1]
    return (value * factor, True) if hit else (value, False)


def _checked_ranges(value_range, outlier_fraction, extrapolate: bool, extrapolation_range) -> tuple:
    """The checked ``(lo, hi)`` of ``value_range``, the integer range ``(int_lo, int_hi)`` of the ``copy`` and
    ``scaled`` draws, and the templates of the corpus (no ``price`` when extrapolating)."""
    lo, hi = _check_range(value_range, "value_range")
    if (
        isinstance(outlier_fraction, bool)
        or not isinstance(outlier_fraction, (int, float))
        or not 0 <= outlier_fraction <= 1
    ):
        raise ValueError(f"outlier_fraction must be a number in [0, 1], got {outlier_fraction!r}")
    if not isinstance(extrapolate, bool):
        raise TypeError(f"extrapolate must be a bool, got {type(extrapolate).__name__}")
    if extrapolate:
        e_lo, e_hi = _check_range(extrapolation_range, "extrapolation_range")
        if e_lo <= hi:
            raise ValueError(f"extrapolation_range {extrapolation_range!r} must lie above value_range {value_range!r}")
        int_lo, int_hi = math.ceil(e_lo), math.floor(e_hi)
        templates = ("copy", "scaled")
    else:
        int_lo, int_hi = math.ceil(lo), math.floor(hi)
        templates = TEMPLATES
    if int_hi // 2 < int_lo:
        raise ValueError("the range holds no integer x with 2x inside it")
    return (lo, hi), (int_lo, int_hi), templates


def _record(template: str, phrase: str, rng: random.Random, strings: dict, roles: dict) -> DomainBRecord:
    """The record of ``phrase`` filled with the number strings ``strings`` (random words from ``rng``); ``roles``
    maps each number's key to ``(role, is_outlier, value before the outlier factor)``."""
    text, spans = _fill(phrase, rng, strings)
    numbers = []
    for start, end, key in spans:
        role, is_outlier, base = roles[key]
        written = text[start:end]
        numbers.append(
            DomainBNumber(
                start,
                end,
                written,
                parse_number(written),
                role,
                is_outlier,
                parse_number(_price_text(base) if template == "price" else _int_text(base)),
            )
        )
    return DomainBRecord(text, template, tuple(numbers))


def domain_b_records(
    n: int,
    seed: int,
    *,
    value_range=DEFAULT_VALUE_RANGE,
    outlier_fraction: float = 0.0,
    extrapolate: bool = False,
    extrapolation_range=DEFAULT_EXTRAPOLATION_RANGE,
) -> list[DomainBRecord]:
    """``n`` domain-B texts with their numbers (the templates, outliers and extrapolation of the module docstring).

    Drawn with ``random.Random("domain-B/{seed}")`` (templates, words, values) and a separate
    ``random.Random("domain-B-outliers/{seed}")`` (one Bernoulli and one factor per target number), so the
    texts are a function of the arguments alone.
    """
    check_count(n)
    check_seed(seed)
    (lo, hi), (int_lo, int_hi), templates = _checked_ranges(
        value_range, outlier_fraction, extrapolate, extrapolation_range
    )
    means = item_means((lo, hi))
    price_lo, price_hi = math.ceil(lo * 10) / 10, math.floor(hi * 10) / 10
    rng = random.Random(f"domain-B/{seed}")
    rng_out = random.Random(f"domain-B-outliers/{seed}")
    records = []
    for _ in range(n):
        template = rng.choice(templates)
        if template == "price":
            item = rng.choice(sorted(means))
            base = min(max(round(means[item] * math.exp(PRICE_NOISE * rng.gauss(0.0, 1.0)), 1), price_lo), price_hi)
            value, is_outlier = _outlier(base, rng_out, outlier_fraction)
            strings = {"p": _price_text(value), "_words": {"item": item}}
            roles = {"p": ("target", is_outlier, base)}
            phrase = rng.choice(_PRICE_PHRASES)
        elif template == "copy":
            x = rng.randint(int_lo, int_hi)
            value, is_outlier = _outlier(float(x), rng_out, outlier_fraction)
            strings = {"x": _int_text(x), "y": _int_text(value)}
            roles = {"x": ("given", False, float(x)), "y": ("target", is_outlier, float(x))}
            phrase = rng.choice(_COPY_PHRASES)
        else:  # scaled
            x = rng.randint(int_lo, int_hi // 2)
            value, is_outlier = _outlier(2.0 * x, rng_out, outlier_fraction)
            strings = {"x": _int_text(x), "y": _int_text(value)}
            roles = {"x": ("given", False, float(x)), "y": ("target", is_outlier, 2.0 * x)}
            phrase = rng.choice(_SCALED_PHRASES)
        records.append(_record(template, phrase, rng, strings, roles))
    return records


def domain_b_texts(n: int, seed: int, **options) -> list[str]:
    """The texts of `domain_b_records` (same arguments)."""
    return [record.text for record in domain_b_records(n, seed, **options)]


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
