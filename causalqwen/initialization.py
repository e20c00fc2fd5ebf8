r"""The initial scale and threshold of a conversion from Qwen2.

`CausalQwenForCausalLM.from_qwen` starts every class location at Qwen's logit,
$\mathrm{loc}_{S_k} = \ell_k$. What it still has to choose are two free numbers: the initial scale of $U$,
$\gamma$ = ``abduction_scale_init``, and the OvR threshold $C$ = ``ovr_threshold``. At initialization

$$
P_k = \frac12 + \frac1\pi \arctan \frac{\ell_k - C}{\sigma_k}, \qquad
\sigma_k = (\gamma + \beta)\,\lVert W_{\mathrm{cls},k} \rVert_1 ,
$$

with $\beta$ = ``noise_init``. The decision $\arg\max_k P_k$ is Qwen's greedy token exactly when $C$ lies between
the largest logit $\ell_{(1)}$ and the second largest $\ell_{(2)}$: the top class is then the only one with
$P_k > \tfrac12$. Away from that interval the per-class scales $\sigma_k$ reorder the classes (far above the logits
the class with the largest row norm wins, far below the smallest). Because $\gamma + \beta$ multiplies every
$\sigma_k$ alike, $\gamma$ does not change the decision at initialization; it sets how sharp the probabilities are,
and with them the loss that training starts from: a class below its threshold by $d = C - \ell_k$ has
$P_k \approx \sigma_k / (\pi d)$, so a wide start makes every wrong class likely at once.

**The threshold from the base** (``ovr_threshold_init``). A fixed $C$ fits one base only, since logit ranges
differ from model to model. The rules read the base's own logits at the text positions of a calibration batch:

| rule | $C$ |
|---|---|
| ``"top_two_midpoint"`` (from_qwen's default) | the median over positions $i$ of $\tfrac12(\ell_{(1),i} + \ell_{(2),i})$ |
| ``"top_logit_quantile"`` | the quantile ``ovr_threshold_quantile`` of $\ell_{(1),i}$ over positions |
| ``"fixed"`` | ``ovr_threshold`` as given (what a config without the field means) |

The midpoint puts $C$ inside $(\ell_{(2)}, \ell_{(1)})$ at a typical position, which is where the decision is
Qwen's. Without a calibration batch the base writes its own (`sample_calibration_batch`): ancestral samples at
temperature 1 from a fixed seed, so the logits are those of text the base itself finds typical, in any
language or domain, and the result does not depend on the global random state. The sampling shows a progress
bar on stderr (``calibration``, one tick per sampled token; a 0.5B base in bfloat16 on a CPU takes minutes),
shown as transformers shows its own: ``transformers.utils.logging.disable_progress_bar()`` (or
``HF_HUB_DISABLE_PROGRESS_BARS=1``) turns it off, together with the bars of ``from_pretrained`` and
``save_pretrained``; ``progress=False`` turns off this one.

The drafts' values, $\gamma = 10$ and $C = 100$ (`DRAFT_INIT`), stay available by configuration; V10 in the
validation report measures why they are not the default. The calibrated values, $\gamma = 0.1$ and the rule
``"top_two_midpoint"``, are `causalqwen.CausalQwenConfig`'s class defaults and live there alone (a conversion
reads them from the class); a config made without a base has no logits to calibrate on and starts at $C = 0$,
what ``"top_two_midpoint"`` gives for a base whose logits are all zero.
"""  # noqa: E501 -- the table rows above: a Markdown table row is one line

from __future__ import annotations

import inspect
import math
import numbers

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers.utils import logging as transformers_logging

__all__ = [
    "copy_base_weights",
    "THRESHOLD_INITS",
    "DRAFT_INIT",
    "CALIBRATION_SEQUENCES",
    "CALIBRATION_LENGTH",
    "CALIBRATION_SEED",
    "check_threshold_init",
    "threshold_rule_settings",
    "threshold_from_logits",
    "sample_calibration_batch",
    "calibration_logits",
    "initial_threshold",
]

THRESHOLD_INITS = ("top_two_midpoint", "top_logit_quantile", "fixed")

# The design drafts' values: reachable as from_qwen(base, **DRAFT_INIT), and what a saved config without these
# fields means. The calibrated ones (decided from V10) are CausalQwenConfig's class defaults.
DRAFT_INIT = {"abduction_scale_init": 10.0, "ovr_threshold": 100.0, "ovr_threshold_init": "fixed"}

CALIBRATION_SEQUENCES = 8  # sequences the base samples when no calibration batch is given
CALIBRATION_LENGTH = 32  # tokens per sampled sequence
CALIBRATION_SEED = 0


def check_threshold_init(rule, quantile) -> None:
    """A ``ValueError`` naming the setting unless ``rule`` is one of `THRESHOLD_INITS` and ``quantile`` in (0, 1)."""
    if not isinstance(rule, str) or rule not in THRESHOLD_INITS:
        raise ValueError(f"config field ovr_threshold_init must be one of {', '.join(THRESHOLD_INITS)}, got {rule!r}")
    if (
        isinstance(quantile, bool)
        or not isinstance(quantile, numbers.Real)
        or not math.isfinite(quantile)
        or not 0 < quantile < 1
    ):
        raise ValueError(f"config field ovr_threshold_quantile must be a number in (0, 1), got {quantile!r}")


def threshold_rule_settings(overrides: dict, calibration, default_rule: str) -> dict:
    """``overrides`` with the threshold's rule settled: the rule given, else ``"fixed"`` for an ``ovr_threshold``
    given alone, else ``default_rule`` (the config's class default). A threshold with another rule, a quantile
    without its rule, or a calibration batch without a rule is a ``ValueError``."""
    settings = dict(overrides)
    settings.setdefault("ovr_threshold_init", "fixed" if "ovr_threshold" in overrides else default_rule)
    rule = settings["ovr_threshold_init"]
    check_threshold_init(rule, settings.get("ovr_threshold_quantile", 0.5))
    if rule != "fixed" and "ovr_threshold" in overrides:
        raise ValueError(
            f"from_qwen: ovr_threshold={overrides['ovr_threshold']!r} fixes the threshold, "
            f"ovr_threshold_init={rule!r} computes it from the base; pass one of them"
        )
    if rule == "fixed" and "ovr_threshold" not in overrides:
        raise ValueError(
            'from_qwen: ovr_threshold_init="fixed" takes the threshold as given: pass ovr_threshold '
            "too (the drafts' value is 100.0, causalqwen.initialization.DRAFT_INIT)"
        )
    if "ovr_threshold_quantile" in overrides and rule != "top_logit_quantile":
        raise ValueError(
            f'from_qwen: ovr_threshold_quantile is read by the rule "top_logit_quantile" only; '
            f"ovr_threshold_init is {rule!r}"
        )
    if rule == "fixed" and calibration is not None:
        raise ValueError(
            "from_qwen: calibration is read by a threshold rule (ovr_threshold_init), and the threshold "
            "is fixed here; drop calibration or choose a rule"
        )
    return settings


def threshold_from_logits(logits: Tensor, rule: str, quantile: float = 0.5) -> float:
    r"""$C$ by ``rule`` from the logits ``[N, V]`` of $N$ calibration positions (module docstring), in float64.

    ``"top_two_midpoint"``: $\mathrm{median}_i\,\tfrac12(\ell_{(1),i} + \ell_{(2),i})$;
    ``"top_logit_quantile"``: the ``quantile`` of $\ell_{(1),i}$ (linear interpolation, as ``torch.quantile``).
    """
    check_threshold_init(rule, quantile)
    if rule == "fixed":
        raise ValueError('ovr_threshold_init "fixed" takes ovr_threshold as given; there is nothing to compute')
    if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] < 2:
        raise ValueError(f"calibration logits must be [N >= 1, V >= 2], got {list(logits.shape)}")
    if not torch.isfinite(logits).all():
        raise ValueError("the base's calibration logits are not all finite")
    top = logits.double().topk(2, dim=-1).values  # [N, 2]
    if rule == "top_two_midpoint":
        return float(top.mean(dim=-1).median())
    return float(torch.quantile(top[:, 0], quantile))


@torch.no_grad()
def sample_calibration_batch(
    base,
    sequences: int = CALIBRATION_SEQUENCES,
    length: int = CALIBRATION_LENGTH,
    seed: int = CALIBRATION_SEED,
    vocab_limit: int | None = None,
    progress: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Text the base writes itself: ``(input_ids [sequences, length + 1], logits [sequences * length, V])``.

    Each sequence starts at the base's BOS token (its EOS, or id 0, when it has none) and continues by
    ancestral sampling at temperature 1, with the KV cache, from a generator seeded with ``seed``, among the ids
    below ``vocab_limit`` (all when None; `from_qwen` passes the ``<NUM>`` id, ``len(tokenizer)``, so that no
    reserved row and no ``<NUM>`` is written); ``logits`` are the base's full logits at every sampled position
    (float32), the distributions the tokens were drawn from. ``progress``: the bar on stderr, one tick per
    sampled position; None shows it when transformers shows its bars
    (``transformers.utils.logging.is_progress_bar_enabled()``).
    """
    config = base.config
    start = config.bos_token_id if config.bos_token_id is not None else config.eos_token_id
    start = start[0] if isinstance(start, (list, tuple)) else start
    start = 0 if start is None else int(start)
    device = base.get_input_embeddings().weight.device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.full((sequences, 1), start, dtype=torch.long, device=device)  # [n, 1]
    step_input, cache, steps = ids, None, []
    # the base's name for its KV cache, argument and output field alike (transformers 5.24 renamed past_key_values)
    cache_name = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    was_training = base.training
    base.eval()
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {progress!r}")
    shown = transformers_logging.is_progress_bar_enabled() if progress is None else progress
    bar = tqdm(total=length, desc="calibration", unit="token", disable=not shown)
    try:
        for _ in range(length):
            output = base(input_ids=step_input, use_cache=True, **({cache_name: cache} if cache is not None else {}))
            cache = output[cache_name]
            logits = output.logits[:, -1].float()  # [n, V]
            steps.append(logits.cpu())
            allowed = logits.cpu().double()[:, :vocab_limit]  # [n, V'] (the whole row when vocab_limit is None)
            token = torch.multinomial(torch.softmax(allowed, dim=-1), 1, generator=generator)  # [n, 1]
            step_input = token.to(device)
            ids = torch.cat([ids, step_input], dim=1)
            bar.update(1)
    finally:
        bar.close()
        base.train(was_training)
    return ids, torch.cat(steps, dim=0)  # [n, length + 1], [n * length, V]


@torch.no_grad()
def calibration_logits(base, calibration, num_token_id: int | None = None) -> Tensor:
    """The base's logits ``[N, V]`` at the text positions of a calibration batch (a mapping with ``input_ids``
    ``[B, S]`` and optionally ``attention_mask``): positions that are not padding and whose token is not
    ``<NUM>`` (``num_token_id``; the base cannot read a number's value). A ``ValueError`` when there are none."""
    if not hasattr(calibration, "keys"):
        raise TypeError(
            "calibration must be a mapping with input_ids [B, S] (and optionally attention_mask), "
            f"got {type(calibration).__name__}"
        )
    if "input_ids" not in calibration:
        raise ValueError(
            f"calibration has no input_ids (its keys: {', '.join(map(repr, calibration.keys())) or 'none'})"
        )
    unknown = sorted(
        set(calibration.keys()) - {"input_ids", "attention_mask", "numeric_values", "labels", "numeric_labels"}
    )
    if unknown:
        raise ValueError(f"calibration: unknown key(s) {', '.join(map(repr, unknown))}")
    input_ids = calibration["input_ids"]
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError("calibration input_ids must be an integer tensor [B, S]")
    vocab = base.config.vocab_size
    if input_ids.numel() and not (0 <= int(input_ids.min()) and int(input_ids.max()) < vocab):
        raise ValueError(f"calibration input_ids must lie in [0, {vocab})")
    mask = calibration.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(input_ids)
    if not isinstance(mask, Tensor) or mask.shape != input_ids.shape or not ((mask == 0) | (mask == 1)).all():
        raise ValueError("calibration attention_mask must be a 0/1 tensor of input_ids' shape")
    text = mask.bool().clone()  # the caller's mask is never changed
    if num_token_id is not None:
        text &= input_ids != num_token_id
    if not text.any():
        raise ValueError(
            "calibration has no text positions (every position is padding or <NUM>): "
            "ovr_threshold_init needs the base's logits at text"
        )
    device = base.get_input_embeddings().weight.device
    was_training = base.training
    base.eval()
    try:
        logits = base(input_ids=input_ids.long().to(device), attention_mask=mask.long().to(device)).logits  # [B, S, V]
    finally:
        base.train(was_training)
    return logits[text.to(device)].float().cpu()  # [N, V]


def initial_threshold(
    base,
    rule: str,
    quantile: float = 0.5,
    calibration=None,
    num_token_id: int | None = None,
    progress: bool | None = None,
) -> float:
    """$C$ for a conversion of ``base`` by ``rule``: from ``calibration`` when given, else from text the base
    samples itself (`sample_calibration_batch`, whose progress bar ``progress`` switches)."""
    check_threshold_init(rule, quantile)
    if calibration is None:
        _, logits = sample_calibration_batch(base, vocab_limit=num_token_id, progress=progress)
    else:
        logits = calibration_logits(base, calibration, num_token_id)
    return threshold_from_logits(logits, rule, quantile)


@torch.no_grad()
def copy_base_weights(base, model) -> None:
    """The Qwen2 stack of ``base`` (a ``Qwen2ForCausalLM``) into ``model.model`` and its lm_head into
    $W_{\\mathrm{cls}}$ of ``model`` (a new `CausalQwenForCausalLM`), whose own modules keep their initialization."""
    base_vocab = base.config.vocab_size
    backbone = base.model.state_dict()
    if model.config.vocab_size > base_vocab:
        new_row = model.model.embed_tokens.weight[base_vocab:]  # initialised like the other rows
        backbone["embed_tokens.weight"] = torch.cat([backbone["embed_tokens.weight"], new_row], dim=0)
    missing, unexpected = model.model.load_state_dict(backbone, strict=False)
    own = tuple(
        name for name, _ in model.model.named_parameters() if name.startswith(("numerical_embedding.", "abduction."))
    )
    if unexpected or set(missing) - set(own):
        raise ValueError(
            f"the base's Qwen2 stack does not fit: missing {sorted(set(missing) - set(own))}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.action.classification_head.weight[:base_vocab].copy_(base.get_output_embeddings().weight)
