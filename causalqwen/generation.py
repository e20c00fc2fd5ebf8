r"""Autoregressive generation with numbers (decision D12; docs: generation.md).

Every step emits a *pair*: a token id and a value. When the chosen token is ``<NUM>`` its value is
the predicted $\mathrm{loc}_Y$ of that step, and it re-enters the model at the next step through the
numerical embedding $\phi$; for every other token the value is 0.0. The text is recovered with
``NumericTokenizer.decode(sequences, numeric_values)``.

One step, for a batch of rows:

$$
\begin{aligned}
(\mathrm{loc}_{U_t}, \mathrm{scale}_{U_t}) &= \mathrm{abduce}(x_{\le t}, v_{\le t})
\;\to\; U'_t \text{ (the mode, D11)}, \\
(S_t, Y_t) &= \mathrm{action}(U'_t), \\
(x_{t+1}, v_{t+1}) &= \big(\arg\max_k P_{k,t},\ \mathrm{loc}_{Y_t}\,[x_{t+1} = \langle NUM\rangle]\big).
\end{aligned}
$$

``shared_individual`` draws $\varepsilon \in (0,1)^C$ and ``shared_noise`` draws
$\varepsilon_n \in \mathbb{R}^C$ once per row before the first step and reuse them at every step;
``causal`` draws a fresh $\varepsilon$ per row and step; ``traditional`` samples the token from
`traditional_probabilities`. The prompt's keys and values are kept in the model's key/value cache
(``model.new_key_value_cache()``, transformers' ``DynamicCache``, made by the transformers wing:
`causalqwen.integrations.generation_mixin`), so each new step runs the stack on one token per row. Prompts are
left-padded; positions count real tokens only. A row stops after its EOS token and is then filled with the pad
token (value 0.0, attention mask 0); generation stops early when every row has stopped.

This module imports torch, the sections and the doors' checks alone (no transformers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from .cauchy import validating, validation
from .checks.doors import open_door, position_ids_from_mask, refuse_meta
from .checks.values import first_index
from .decision import DecisionHead
from .inference import (
    as_number,
    check_mode,
    check_noise,
    check_normalize,
    check_sampling_args,
    check_uniform,
    draw_standard_cauchy,
    draw_uniform,
)
from .losses import as_bool_mask

__all__ = [
    "generate",
    "GenerationOutput",
    "check_prompt",
    "check_generator",
    "check_length",
    "check_generated_values",
    "mode_draws",
    "widened_values",
]


@dataclass
class GenerationOutput(Mapping):
    r"""Result of `generate`; prompts included, left padding kept.

    Read by attribute (``out.sequences``) or as a mapping of the fields that are set, in order (``out["sequences"]``,
    ``dict(out)``, ``tokenizer.batch_decode(out)``), and by position among them (``out[0]``, `to_tuple`), as
    transformers' ``ModelOutput`` is read.

    Attributes:
        sequences: token ids ``[B, S + T]`` (prompt, then $T \le$ ``max_new_tokens`` generated steps).
        numeric_values: the value beside each token ``[B, S + T]``: the prompt's values, then
            $\mathrm{loc}_Y$ at every generated ``<NUM>`` and 0.0 elsewhere. float64 if the prompt's
            values were float64, else float32 (integer and 16-bit prompt values are widened, never
            the predictions narrowed).
        attention_mask: ``[B, S + T]``, the prompt's mask, then 1 for each generated token up to and
            including the row's EOS and 0 for the padding after it.
        loc_U: location of the law of $U$ at each generated step, ``[B, T, C]`` (only with
            ``output_decision_inputs=True``).
        scale_U: its scale, ``[B, T, C]`` (same condition).
        decision_loc: location of the decision input $U'$ the action map received at each step,
            ``[B, T, C]`` (only with ``output_decision_inputs=True``; for ``traditional``, the
            standard one).
        decision_scale: its scale, ``[B, T, C]`` (same condition).
        prompt_length: the prompts' width $S$: the first $S$ positions of each row are its prompt (with its
            padding), where ``tokenizer.batch_decode(out, number_texts=...)`` tells the prompt's ``<NUM>`` (which
            ``number_texts`` name) from the generated ones.
    """

    sequences: torch.LongTensor | None = None
    numeric_values: torch.FloatTensor | None = None
    attention_mask: torch.LongTensor | None = None
    loc_U: torch.FloatTensor | None = None
    scale_U: torch.FloatTensor | None = None
    decision_loc: torch.FloatTensor | None = None
    decision_scale: torch.FloatTensor | None = None
    prompt_length: int | None = None

    def set_fields(self) -> list[str]:
        """The names of the fields that are set (not None), in order: the mapping's keys."""
        return [field.name for field in fields(self) if getattr(self, field.name) is not None]

    def to_tuple(self) -> tuple:
        """The values of the fields that are set, in order."""
        return tuple(getattr(self, name) for name in self.set_fields())

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self.set_fields():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]  # a position or a slice among the fields that are set

    def __iter__(self):
        return iter(self.set_fields())

    def __len__(self) -> int:
        return len(self.set_fields())


def _token_ids(value, name: str, vocab_size: int) -> list[int]:
    if value is None:
        return []
    single = as_number(value, integer=True)
    try:
        ids = [single] if single is not None else [as_number(i, integer=True) for i in value]
    except TypeError:
        ids = [None]
    if not all(i is not None and i >= 0 for i in ids):
        raise ValueError(f"{name} must be a non-negative int or a list of them, got {value!r}")
    if any(i >= vocab_size for i in ids):
        raise ValueError(
            f"{name} must be a token id (or a list of them) in [0, vocab_size={vocab_size}), got {value!r}"
        )
    return ids


def _check_left_padding(attention_mask, input_ids: Tensor) -> Tensor:
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor of 0s and 1s, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )
    mask = as_bool_mask(attention_mask, "attention_mask")  # [B, S]
    right_padded = (mask[:, :-1] & ~mask[:, 1:]).any(dim=-1)  # a real token followed by padding
    if bool(right_padded.any()):
        row = int(right_padded.nonzero()[0, 0])
        raise ValueError(
            f"generation needs left padding, but attention_mask row {row} has padding after a real token; "
            "tokenize the prompts with padding_side='left'"
        )
    if not bool(mask[:, -1].all()):
        row = int((~mask[:, -1]).nonzero()[0, 0])
        raise ValueError(
            f"prompt {row} is empty: attention_mask row {row} has no real token, and every prompt needs at least one"
        )
    return mask


def check_prompt(config, input_ids: Tensor, numeric_values, attention_mask) -> tuple[Tensor, int]:
    """The prompt's checks at both generation doors (`generate` and ``model.generate``): no empty prompt (named by
    its index), left padding, at most ``max_position_embeddings`` tokens, and the model's own checks of ids and
    values (`doors.open_door`). Returns the mask ``[B, S]`` (long) and the longest prompt's token count. While
    `causalqwen.cauchy.validating` is False the prompt is taken as checked: only the mask and the count are formed."""
    if not validating():
        mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).bool().long()  # [B, S]
        return mask, int(mask.sum(-1).max())
    refuse_meta(input_ids=input_ids, numeric_values=numeric_values, attention_mask=attention_mask)
    if input_ids.numel() == 0:
        raise ValueError(
            f"input_ids must hold at least one prompt of at least one token, got shape {tuple(input_ids.shape)}"
            + (": prompt 0 is empty" if input_ids.shape[0] else "")
        )
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    mask = _check_left_padding(attention_mask, input_ids).long()  # [B, S]
    longest = int(mask.sum(-1).max())
    if longest > config.max_position_embeddings:
        raise ValueError(
            f"the prompt has {longest} tokens, more than max_position_embeddings={config.max_position_embeddings}"
        )
    open_door(config, input_ids, numeric_values, mask)  # the prompt, once: ids, values, <NUM> without values
    return mask, longest


def check_generator(generator) -> None:
    """A ``TypeError`` unless ``generator`` (the source of the modes' draws) is None or a ``torch.Generator``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")


def check_length(config, longest: int, new_tokens: int, max_length: int | None = None) -> None:
    """A ``ValueError`` before the first step when the longest prompt and ``new_tokens`` (``max_new_tokens``, or
    what ``max_length`` leaves after the prompt) need more positions than the model has."""
    limit = config.max_position_embeddings
    if longest + new_tokens <= limit:
        return
    if max_length is None:
        raise ValueError(
            f"prompt ({longest} tokens) + max_new_tokens ({new_tokens}) exceeds "
            f"max_position_embeddings={limit}; lower max_new_tokens"
        )
    raise ValueError(
        f"prompt ({longest} tokens) + {new_tokens} new tokens (up to max_length={max_length}) exceeds "
        f"max_position_embeddings={limit}; lower max_length"
    )


def check_generated_values(values: Tensor, prompt_width: int, dtype: torch.dtype) -> None:
    r"""A ``ValueError`` after the loop when a generated value is not finite: $\mathrm{loc}_Y$ at a ``<NUM>`` beyond
    the range of the model's ``dtype`` (float16 ends at 65504), which the later steps then read as input, as no
    forward would take it. One host synchronisation, made while `causalqwen.cauchy.validating`; ``values``
    ``[B, S + T]``, the new ones after ``prompt_width``."""
    bad = ~torch.isfinite(values[:, prompt_width:])  # [B, T]
    if not bool(bad.any()):
        return
    row, step = first_index(bad)
    name = str(dtype).removeprefix("torch.")
    advice = "generate in float32 or bfloat16" if dtype == torch.float16 else "check the regression head's weights"
    raise ValueError(
        f"generation made a value that is not finite ({values[row, prompt_width + step].item()}) at row {row}, new "
        f"token {step}: loc_Y overflowed the model's {name} (largest finite value {torch.finfo(dtype).max:.6g}), "
        f"and the later steps read it as input; {advice}"
    )


def _check_fixed_draw(name: str, value: Tensor | None, mode: str, wanted_mode: str, shape: tuple[int, int]):
    if value is None:
        return None
    if mode != wanted_mode:
        raise ValueError(
            f"{name} fixes the per-sequence draw of mode {wanted_mode!r}; it has no meaning for mode {mode!r}"
        )
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a tensor of shape [B, C] or [C], got {type(value).__name__}")
    batch, causal_size = shape
    if value.shape not in ((causal_size,), (batch, causal_size)):
        raise ValueError(
            f"{name} must have shape [{batch}, {causal_size}] or [{causal_size}], got {tuple(value.shape)}"
        )
    if validating():
        if name == "uniform":
            check_uniform(value)
        else:
            check_noise(value)
    return value.expand(batch, causal_size)


def mode_draws(model, input_ids: Tensor, mode: str, *, uniform=None, noise=None, generator=None) -> dict:
    """The random inputs of every step of ``mode``, as keywords of `DecisionHead.choose` / ``step_scores``: the shared
    modes' one draw per row (``uniform`` / ``noise`` as given, checked, or drawn now from ``generator``) and the
    generator (``causal``'s draws per step). Both generation loops take their draws from here. A given draw's values
    are checked while `causalqwen.cauchy.validating`."""
    shape, device = (input_ids.shape[0], model.config.causal_size), input_ids.device
    fixed_uniform = _check_fixed_draw("uniform", uniform, mode, "shared_individual", shape)
    fixed_noise = _check_fixed_draw("noise", noise, mode, "shared_noise", shape)
    if mode == "shared_individual" and fixed_uniform is None:
        fixed_uniform = draw_uniform(shape, generator=generator, device=device)  # once per row
    if mode == "shared_noise" and fixed_noise is None:
        fixed_noise = draw_standard_cauchy(shape, generator=generator, device=device)
    return dict(uniform=fixed_uniform, noise=fixed_noise, generator=generator)


def widened_values(numeric_values, input_ids: Tensor) -> Tensor:
    """The values column the generated values are appended to: float32 or float64, never narrower.

    Integer, float16 or bfloat16 prompts are widened to float32: the generated values are float32
    predictions and must not be cast into a type that truncates (11.58 -> 11), wraps (uint8) or
    overflows (-1e5 -> -inf) them."""
    if numeric_values is None:
        return torch.zeros(input_ids.shape, device=input_ids.device)  # [B, S]
    if numeric_values.dtype.is_floating_point and torch.finfo(numeric_values.dtype).bits >= 32:
        return numeric_values
    return numeric_values.to(torch.float32)


@dataclass
class _Rule:
    """How `generate` goes on, every argument checked: the mode and its draws, the sampling settings of
    ``traditional`` (temperature, top_k, top_p, normalize), the length and the stop."""

    mode: str
    draws: dict
    sampling: tuple
    max_new_tokens: int
    eos_ids: list[int]
    pad_token_id: int
    use_cache: bool
    trace: bool


def generate(
    model,
    input_ids: torch.LongTensor,
    numeric_values: torch.FloatTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    mode: str = "standard",
    max_new_tokens: int = 32,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    use_cache: bool = True,
    pad_token_id: int | None = None,
    normalize: str = "softmax",
    uniform: Tensor | None = None,
    noise: Tensor | None = None,
    output_decision_inputs: bool = False,
) -> GenerationOutput:
    r"""Generate up to ``max_new_tokens`` (token, value) pairs per row with one of the five modes.

    Args:
        model: a `CausalQwenForCausalLM` (its train/eval mode is left as it is).
        input_ids: the prompt ids ``[B, S]``, left-padded.
        numeric_values: the values beside them ``[B, S]``.
        attention_mask: the prompts' mask ``[B, S]``.
        mode: ``"standard"``, ``"causal"``, ``"shared_individual"``, ``"shared_noise"`` or ``"traditional"``.
        generator: the source of every random draw; the same seed gives the same output.
        temperature: the ``traditional`` mode's temperature (see `traditional_probabilities`), any finite
            number > 0; a tiny one acts as greedy, as in ``model.generate``. Other modes reject non-default
            values of this and the next three.
        top_k: the ``traditional`` mode's top-k cut.
        top_p: the ``traditional`` mode's nucleus cut.
        normalize: the ``traditional`` mode's normalization of the class scores.
        eos_token_id: id or ids that end a row (default: ``model.config.eos_token_id``).
        use_cache: keep the model's key/value cache (True) or rerun the whole sequence at every step (False,
            the reference the cache is tested against).
        pad_token_id: fills a row after its EOS (default: ``model.config.pad_token_id``, else the first EOS id).
        uniform: fixes $\varepsilon$ of ``shared_individual``, ``[B, C]`` or ``[C]`` in (0, 1).
        noise: fixes $\varepsilon_n$ of ``shared_noise``, ``[B, C]`` or ``[C]``, finite.
        output_decision_inputs: also return $U$ and $U'$ of every step.

    Everything after ``attention_mask`` is keyword-only. The prompt and the draws are checked here, at the door,
    while `causalqwen.cauchy.validating` (the keywords always); the steps run under ``cauchy.validation(False)``.
    """
    _check_model(model)
    check_mode(mode)
    new_tokens = _checked_max_new_tokens(max_new_tokens)
    sampling = (*check_sampling_args(temperature, top_k, top_p), check_normalize(normalize))
    if mode != "traditional" and sampling != (1.0, 0, 1.0, "softmax"):
        raise ValueError(
            f"temperature, top_k, top_p and normalize apply to mode='traditional' only; mode {mode!r} does not sample "
            "from a categorical distribution"
        )
    check_generator(generator)
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a [B, S] integer tensor")
    mask, longest = check_prompt(model.config, input_ids, numeric_values, attention_mask)
    check_length(model.config, longest, new_tokens)
    eos_ids, pad_token_id = _stop_ids(model.config, eos_token_id, pad_token_id)
    draws = mode_draws(model, input_ids, mode, uniform=uniform, noise=noise, generator=generator)
    rule = _Rule(mode, draws, sampling, new_tokens, eos_ids, pad_token_id, use_cache, output_decision_inputs)
    with torch.no_grad(), validation(False):  # every step's inputs are the checked prompt and the model's own
        sequences, values, mask, trace = _loop(model, input_ids, widened_values(numeric_values, input_ids), mask, rule)
    if validating():
        check_generated_values(values, input_ids.shape[1], model.dtype)
    traced = {}
    if output_decision_inputs and trace:
        names = ("loc_U", "scale_U", "decision_loc", "decision_scale")
        traced = {name: torch.stack(parts, dim=1) for name, parts in zip(names, zip(*trace))}  # [B, T, C] each
    return GenerationOutput(
        sequences=sequences, numeric_values=values, attention_mask=mask, prompt_length=input_ids.shape[1], **traced
    )


def _check_model(model) -> None:
    if not isinstance(getattr(model, "action", None), DecisionHead) or not hasattr(model, "model"):
        raise TypeError(
            f"model must be a CausalQwenForCausalLM (convert a Qwen2 model with CausalQwenForCausalLM.from_qwen), "
            f"got {type(model).__name__}"
        )


def _checked_max_new_tokens(max_new_tokens) -> int:
    requested = as_number(max_new_tokens, integer=True)
    if requested is None or requested < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return requested


def _stop_ids(config, eos_token_id, pad_token_id) -> tuple[list[int], int]:
    """The EOS ids (default: the config's) and the pad id (default: the config's, else the first EOS id, else 0)."""
    eos_ids = _token_ids(
        eos_token_id if eos_token_id is not None else config.eos_token_id, "eos_token_id", config.vocab_size
    )
    if pad_token_id is None:
        pad_token_id = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    _token_ids(pad_token_id, "pad_token_id", config.vocab_size)
    return eos_ids, pad_token_id


def _loop(model, sequences: Tensor, values: Tensor, mask: Tensor, rule: _Rule):
    """The generation loop on checked inputs: abduce, let the head choose, append, stop when every row has.

    One host synchronisation per step (whether any row is still running); Qwen2 adds its own mask check when the
    prompts are padded, as it does in its own ``generate``."""
    head = model.action
    eos = torch.tensor(rule.eos_ids, dtype=sequences.dtype, device=sequences.device)
    unfinished = torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)  # [B]
    cache = model.new_key_value_cache() if rule.use_cache else None  # filled step by step by the stack
    # |W_cls| [V, C], formed once, not per step; traditional sampling from softmax(loc_S / T) never needs it
    needs_scales = rule.mode != "traditional" or rule.sampling[3] == "ovr"
    abs_weight = head.classification_head.weight.abs() if needs_scales else None
    positions = position_ids_from_mask(mask)  # [B, S] real tokens only (left padding)
    # What Qwen2 sees: the prompts' padding, then every step as real. A finished row goes on attending to its own
    # pad tokens, but its outputs are discarded; without prompt padding Qwen2 gets no mask (and checks none).
    seen = mask if not bool(mask.all()) else None
    step_ids, step_values, step_positions, trace = sequences, values, positions, []
    for _ in range(rule.max_new_tokens):
        if not rule.use_cache:
            step_ids, step_values, step_positions = sequences, values, positions
        law = model.model.law_of_U(
            step_ids, step_values, seen, position_ids=step_positions, cache=cache, use_cache=rule.use_cache
        )
        loc_U, scale_U = law.loc_U[:, -1], law.scale_U[:, -1]  # [B, C] each
        choice = head.choose(rule.mode, loc_U, scale_U, abs_weight=abs_weight, sampling=rule.sampling, **rule.draws)
        if rule.trace:
            trace.append((loc_U, scale_U, choice.loc, choice.scale))
        token = torch.where(unfinished, choice.token, torch.full_like(choice.token, rule.pad_token_id))  # [B]
        value = torch.where(unfinished, choice.value.float(), 0.0).to(values.dtype)  # [B], float32 or wider
        sequences = torch.cat([sequences, token[:, None]], dim=1)  # [B, S + t]
        values = torch.cat([values, value[:, None]], dim=1)
        next_position = positions[:, -1:] + 1  # [B, 1]
        positions = torch.cat([positions, next_position], dim=1)
        mask = torch.cat([mask, unfinished.long()[:, None]], dim=1)
        seen = torch.cat([seen, torch.ones_like(seen[:, :1])], dim=1) if seen is not None else None
        unfinished = unfinished & ~torch.isin(token, eos)
        step_ids, step_values, step_positions = token[:, None], value[:, None], next_position  # [B, 1]
        if not bool(unfinished.any()):  # the one synchronisation per step
            break
    return sequences, values, mask, trace
