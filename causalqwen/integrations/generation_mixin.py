r"""transformers-native generation: `CausalQwenForCausalLM.generate` is `GenerationMixin.generate`.

transformers' loop (``GenerationMixin._sample``) runs, per step: the model's ``forward``, then
``_update_model_kwargs_for_generation``, then the logits processors on ``outputs.logits[:, -1]``, then argmax or
sampling. CausalQwen adds two things that travel beside the ids, in a `GenerationState` kept in the model kwargs
(``generation_state``); the model's ``forward`` is the training forward, unchanged:

* **one forward per job.** Each step is the plain ``forward``, asked for the law of $U$ alone
  (``return_decisions=False``), and the loop runs under ``cauchy.validation(False)``: ``generate`` checks the prompt
  once at its door (while `causalqwen.cauchy.validating`), and every later token and value is the model's own, so a
  step makes no host synchronisation of its own (per token as many as Qwen2's ``generate``: the loop's stop test,
  and Qwen2's mask check with padding).
* **the mode** (decision D11) and its random draws. `_update_model_kwargs_for_generation` (the hook transformers
  calls with each step's outputs) forms, from the last position's law of $U$, the scores whose argmax is the
  mode's choice (`GenerationState.step_scores`, `DecisionHead.step_scores`) and writes them into the step's
  ``logits``: $\log P_k$ for ``standard``, ``causal`` (a fresh draw of $U$ each step, from ``generator``),
  ``shared_individual`` and ``shared_noise`` (one draw per row for the whole sequence); for ``traditional`` the
  class locations $\mathrm{loc}_S$, which transformers' own sampling then turns into a token (``do_sample``,
  ``temperature``, ``top_k``, ``top_p``; its draws come from torch's global RNG). Every logits processor of
  transformers (``min_new_tokens``, a user's ``logits_processor``, ...) runs on the mode's scores. A step costs what
  the reference loop's does: one decision, $|W_{\mathrm{cls}}|$ formed once per call.
* **the values**: the state keeps $\mathrm{loc}_Y$ of the mode's decision; when the chosen token is ``<NUM>``,
  that value enters ``numeric_values`` beside it (`prepare_inputs_for_generation`), and so the next step's
  numerical embedding (decision D12).

``return_dict_in_generate=True`` gives a `CausalQwenGenerateOutput`: transformers' output plus
``numeric_values`` ``[B, S + T]``, the one way to the values of the ``<NUM>`` tokens
(``tokenizer.decode(out.sequences[0], out.numeric_values[0])``); without it, the ids alone come back, as in
transformers, and ``tokenizer.decode(ids)`` writes each ``<NUM>`` as the literal ``<NUM>``. A ``streamer`` with an
``attach_generation_state(state)`` method (`causalqwen.integrations.streamer.NumericTextStreamer`) is handed the
state before the prompt, and reads each token's value there (`GenerationState.chosen_values`).
`causalqwen.generate` is the reference loop this one is tested
against (equal sequences and values in every mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import GenerationMixin, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache
from transformers.generation.logits_process import TemperatureLogitsWarper
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..cauchy import validating, validation
from ..checks.doors import refuse_meta
from ..checks.tokenizer_door import check_number_text_count, checked_number_texts
from ..generation import (
    check_generated_values,
    check_generator,
    check_length,
    check_prompt,
    mode_draws,
    widened_values,
)
from ..inference import MODES, as_number, check_temperature, predicted_value, tempered_scores

__all__ = ["GenerationState", "CausalQwenGenerateOutput", "CausalQwenGenerationMixin"]


@dataclass
class CausalQwenGenerateOutput(GenerateDecoderOnlyOutput):
    r"""transformers' `GenerateDecoderOnlyOutput` plus ``numeric_values`` ``[B, S + T]``: the prompt's values,
    then $\mathrm{loc}_Y$ at every generated ``<NUM>`` and 0.0 elsewhere; and ``number_texts``, the prompts'
    numbers as written, as given to ``generate`` (None if not), which ``tokenizer.batch_decode(out)`` reads; and
    ``prompt_length``, the prompts' width $S$, where ``batch_decode`` tells the prompts' ``<NUM>`` (which
    ``number_texts`` name) from the generated ones."""

    numeric_values: torch.FloatTensor | None = None
    number_texts: list | None = None
    prompt_length: int | None = None


class GenerationState:
    """What travels between the steps of transformers' generation loop besides the ids: the mode, its
    draws, the values beside every token so far, and the last step's $\\mathrm{loc}_Y$ ``[B]``."""

    def __init__(self, mode: str, values: Tensor, draws: dict, num_token_id: int, number_texts: list | None = None):
        self.mode = mode
        self.number_texts = number_texts  # the prompts' numbers as written (generate's number_texts), or None
        self.values = values  # [B, S + t]
        self.draws = draws  # uniform, noise, generator (causalqwen.generation.mode_draws)
        self.num_token_id = num_token_id
        self.abs_weight: Tensor | None = None  # |W_cls|, formed once per generate call
        self.last_loc_Y: Tensor | None = None  # [B]

    def step_scores(self, head, outputs) -> Tensor:
        """The mode's scores ``[B, 1, V]`` at the last position of a step's outputs (its law of $U$,
        ``loc_U`` / ``scale_U`` ``[B, S, C]``); keeps $\\mathrm{loc}_Y$ of the mode's decision for the value."""
        scores, self.last_loc_Y = head.step_scores(
            self.mode, outputs.loc_U[:, -1], outputs.scale_U[:, -1], abs_weight=self.abs_weight, **self.draws
        )  # [B, V], [B]
        return scores[:, None, :]  # [B, 1, V]

    def catch_up(self, input_ids: Tensor) -> None:
        """Append the value of the token chosen after the last step: its $\\mathrm{loc}_Y$ if ``<NUM>``, else 0."""
        if input_ids.shape[1] == self.values.shape[1]:
            return
        self.values = torch.cat([self.values, self.chosen_values(input_ids[:, -1])[:, None]], dim=1)

    def chosen_values(self, token_ids: Tensor) -> Tensor:
        """The values ``[B]`` beside the tokens ``[B]`` chosen after the last step: $\\mathrm{loc}_Y$ where
        ``<NUM>``, else 0 -- what `catch_up` appends (a streamer that writes numbers reads them here)."""
        token_ids = token_ids.to(self.last_loc_Y.device)
        return predicted_value(token_ids, self.last_loc_Y.to(self.values.dtype), self.num_token_id)  # [B]


def _new_tokens(kwargs: dict, config, prompt_width: int) -> tuple[int | None, int | None]:
    """``(new tokens, max_length)``: how many tokens transformers will add at most -- ``max_new_tokens``, else
    ``max_length`` (then returned too) less the prompt's width -- from the call or the generation config; None
    where neither is a number (transformers then says what is wrong)."""
    new_tokens = as_number(kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None)), integer=True)
    if new_tokens is not None:
        return new_tokens, None
    max_length = as_number(kwargs.get("max_length", getattr(config, "max_length", None)), integer=True)
    if max_length is None:
        return None, None
    return max(max_length - prompt_width, 0), max_length


# transformers' options that run the model on tokens it did not choose itself (assisted / speculative decoding,
# prompt lookup, multi-token prediction): the candidates carry no <NUM> values and the modes' draws are per step.
_ASSISTED = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")


class _ShiftedTemperatureWarper(TemperatureLogitsWarper):
    """transformers' temperature warper on the scores shifted by their row maximum: the same distribution (and
    the same top-k / top-p / min-p cuts after it), but a tiny temperature sends the other classes to -inf
    instead of the maximum to +inf (NaN) -- as `traditional_probabilities` does in the reference loop."""

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return tempered_scores(scores, self.temperature)  # [B, V], <= 0


# transformers' sampling arguments and the value at which each changes nothing (None: not given)
_SAMPLING_NEUTRAL = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}


def _refuse_sampling_outside_traditional(mode: str, do_sample: bool, kwargs: dict) -> None:
    """``do_sample`` (given or set on the generation config) and the sampling arguments given to ``generate``
    belong to ``traditional``; the other modes draw inside the model (from ``generator``), so a sampling argument
    there would be ignored: refused by name, as the reference loop refuses them. Sampling values stored on a
    generation config (a base's) are not the caller's and pass."""
    if mode == "traditional":
        return
    if do_sample:
        raise ValueError(
            f"do_sample applies to mode='traditional'; mode={mode!r} draws inside the model "
            "(pass generator= for its draws)"
        )
    given = [
        name for name, neutral in _SAMPLING_NEUTRAL.items() if kwargs.get(name) is not None and kwargs[name] != neutral
    ]
    if given:
        raise ValueError(
            f"{', '.join(given)} apply to mode='traditional' only (with do_sample=True); mode={mode!r} does not "
            "sample from a categorical distribution: it draws inside the model (pass generator= for its draws)"
        )


def _refuse_unsupported(kwargs: dict, config) -> None:
    """transformers' options that would not carry CausalQwen's values or draws, refused by name before generating."""
    for name in ("num_beams", "num_return_sequences"):
        if (kwargs.get(name) or getattr(config, name, None) or 1) > 1:
            raise ValueError(
                f"{name} > 1 is not supported: the values beside the ids and the modes' draws are "
                "kept per row, and transformers would copy and reorder the rows without them"
            )
    for name in _ASSISTED:
        value = kwargs[name] if name in kwargs else getattr(config, name, None)
        if value is not None and value is not False:
            raise ValueError(
                f"{name} is not supported: assisted / speculative decoding and prompt lookup run the "
                "model on candidate tokens it did not choose, which carry no <NUM> values (and not the "
                "mode's draws); generate without it"
            )
    stop_strings = kwargs.get("stop_strings", getattr(config, "stop_strings", None))
    tokenizer = kwargs.get("tokenizer")
    if stop_strings is not None and tokenizer is not None and not isinstance(tokenizer, PreTrainedTokenizerBase):
        wrapped = "tok.hf_tokenizer" if hasattr(tokenizer, "hf_tokenizer") else "a transformers tokenizer"
        raise TypeError(
            f"stop_strings need tokenizer to be a transformers PreTrainedTokenizerBase (transformers "
            f"reads its vocabulary), got {type(tokenizer).__name__}: pass tokenizer={wrapped}. The stop "
            "strings are matched against the tokens' text, where a generated number is the text of "
            "the <NUM> token, not its value"
        )


def _check_number_texts(number_texts, input_ids: Tensor, num_token_id: int) -> None:
    """``generate``'s ``number_texts``: None, or one list per row of ``input_ids`` naming exactly the row's ``<NUM>``,
    each text one number of the grammar (`causalqwen.checks.tokenizer_door.checked_number_texts`; each is checked
    against its value where it is written, by the tokenizer's decoding)."""
    if number_texts is None:
        return
    if not isinstance(number_texts, (list, tuple)) or len(number_texts) != input_ids.shape[0]:
        raise ValueError(
            f"number_texts must be one list of str per prompt row ({input_ids.shape[0]}), as the encoding's "
            f"number_texts: pass number_texts=enc.number_texts; got {number_texts!r:.80}"
        )
    for row, texts in enumerate(number_texts):
        given = len(checked_number_texts(texts, f"number_texts[{row}]"))
        try:
            check_number_text_count(given, input_ids[row], num_token_id, prompt_length=input_ids.shape[1])
        except ValueError as error:
            raise ValueError(f"row {row}: {error}") from None


def _checked_mode(mode, config, generator, input_ids, numeric_values, kwargs: dict) -> str:
    """`CausalQwenGenerationMixin.generate`'s call, checked before the prompt: ``input_ids`` a ``[B, S]`` tensor on a
    real device, no ``labels``, the mode (given, else the generation config's, else ``"standard"``), sampling for
    ``traditional`` alone, no option that would drop the values or draws, the generator and the temperature.
    Returns the mode."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise TypeError("generate needs input_ids, a [B, S] tensor of token ids")
    refuse_meta(input_ids=input_ids, numeric_values=numeric_values, attention_mask=kwargs.get("attention_mask"))
    for name in ("labels", "numeric_labels"):
        if name in kwargs:  # transformers would hand it to every forward, which would then score a loss
            raise TypeError(
                f"generate() does not take {name}: it continues the prompt and scores nothing; "
                "call the model itself with labels to compute a loss"
            )
    mode = mode if mode is not None else getattr(config, "mode", None) or "standard"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    do_sample = kwargs.get("do_sample", getattr(config, "do_sample", False))  # given, else the config's
    _refuse_sampling_outside_traditional(mode, do_sample, kwargs)
    _refuse_unsupported(kwargs, config)
    check_generator(generator)
    if mode == "traditional" and do_sample:
        temperature = kwargs.get("temperature", getattr(config, "temperature", None))
        if temperature is not None:
            check_temperature(temperature)
    return mode


class CausalQwenGenerationMixin(GenerationMixin):
    """`GenerationMixin` with the mode and the values of CausalQwen threaded through (see the module)."""

    def generate(
        self,
        inputs: Tensor | None = None,
        generation_config=None,
        *,
        numeric_values: Tensor | None = None,
        mode: str | None = None,
        generator: torch.Generator | None = None,
        uniform: Tensor | None = None,
        noise: Tensor | None = None,
        number_texts: list | None = None,
        **kwargs,
    ):
        r"""transformers' `generate` with CausalQwen's ``mode`` (default: ``generation_config.mode``, else
        ``"standard"``), ``numeric_values`` beside the prompt ids (required where they hold ``<NUM>``),
        ``generator`` for the draws of ``causal`` and the shared modes, ``uniform`` / ``noise`` to fix
        the shared modes' draws, and ``number_texts``, the prompts' numbers as written (the encoding's
        ``number_texts``: one list of str per row, as many as the row's ``<NUM>``), which travel to a
        ``streamer`` and to the output, so that the prompts are written as given
        (``model.generate(**enc, number_texts=enc.number_texts, ...)``). Every other argument is transformers'
        own (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id``,
        ``stopping_criteria``, ``streamer``, ``return_dict_in_generate``, ...); sampling applies to ``traditional``
        only.

        As in the reference loop, ``temperature`` (with ``do_sample=True``) is any finite number > 0, and the
        division by it is `inference.tempered_scores` (transformers' own would give NaN for a tiny one), so a
        tiny temperature acts as greedy. Refused up front, by name: ``num_beams`` / ``num_return_sequences`` > 1,
        assisted / speculative decoding and prompt lookup (``assistant_model``, ``prompt_lookup_num_tokens``,
        ``assistant_early_exit``, ``use_mtp``: their candidate tokens carry no ``<NUM>`` values), a
        ``generator`` that is not a ``torch.Generator``, and ``stop_strings`` with a ``tokenizer`` that is not a
        transformers tokenizer (pass ``tok.hf_tokenizer``; a generated number is matched as the text ``<NUM>``).

        The values: without ``return_dict_in_generate=True`` this returns the ids alone, as transformers' does,
        and the ids do not hold the values of the ``<NUM>`` tokens (the prompt's nor the generated ones):
        ``tokenizer.decode(ids)`` writes each as the literal ``<NUM>``. To get the numbers, pass
        ``return_dict_in_generate=True`` and decode with them:
        ``out = model.generate(**enc, return_dict_in_generate=True)``, then
        ``tokenizer.decode(out.sequences[0], out.numeric_values[0])`` (or
        ``tokenizer.batch_decode(out.sequences, out.numeric_values)``).
        """
        input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
        config = generation_config if generation_config is not None else self.generation_config
        mode = _checked_mode(mode, config, generator, input_ids, numeric_values, kwargs)
        self._check_prompt(input_ids, numeric_values, number_texts, config, kwargs)
        values = widened_values(
            numeric_values if numeric_values is not None else torch.zeros(input_ids.shape), input_ids
        )
        draws = mode_draws(self, input_ids, mode, uniform=uniform, noise=noise, generator=generator)
        state = GenerationState(mode, values, draws, self.config.num_token_id, number_texts)
        if mode != "traditional":  # traditional's scores are the class locations: no |W_cls| product
            state.abs_weight = self.action.classification_head.weight.abs()  # [V, C], once per call
        streamer = kwargs.get("streamer")
        if callable(getattr(streamer, "attach_generation_state", None)):  # a streamer that writes the numbers
            streamer.attach_generation_state(state)  # (integrations.streamer) reads their values from the state
        with torch.no_grad(), validation(False):  # each step's inputs: the checked prompt and the model's own choices
            output = super().generate(input_ids, generation_config=generation_config, generation_state=state, **kwargs)
        sequences = output if isinstance(output, Tensor) else output.sequences
        state.catch_up(sequences)
        if validating():
            check_generated_values(state.values, input_ids.shape[1], self.dtype)
        if isinstance(output, Tensor):
            return output
        return CausalQwenGenerateOutput(
            **output, numeric_values=state.values, number_texts=number_texts, prompt_length=input_ids.shape[1]
        )

    def _check_prompt(self, input_ids: Tensor, numeric_values, number_texts, config, kwargs: dict) -> None:
        """`generate`'s prompt, checked at its door: ``<NUM>`` with values, the prompt's own checks
        (`causalqwen.generation.check_prompt`), ``number_texts``, and the length; a missing ``attention_mask`` is
        set in ``kwargs`` to the prompt's (every token real, as in the reference loop)."""
        num_token_id = self.config.num_token_id
        if validating() and numeric_values is None and bool((input_ids == num_token_id).any()):
            raise ValueError(
                f"input_ids hold <NUM> (id {num_token_id}) but no numeric_values were given: pass the "
                "tokenizer's numeric_values, or every number would silently become 0"
            )
        mask, longest = check_prompt(self.config, input_ids, numeric_values, kwargs.get("attention_mask"))
        _check_number_texts(number_texts, input_ids, num_token_id)
        if kwargs.get("attention_mask") is None:  # as in the reference loop: every token is real (transformers
            kwargs["attention_mask"] = mask  # would otherwise take a pad id inside a prompt for padding)
        new_tokens, max_length = _new_tokens(kwargs, config, input_ids.shape[1])
        if new_tokens is not None:  # refused now, not after generating up to the last position
            check_length(self.config, longest, new_tokens, max_length)

    def new_key_value_cache(self) -> DynamicCache:
        """An empty key/value cache of the Qwen2 stack (transformers' ``DynamicCache``), which `causalqwen.generate`'s
        loop fills step by step: the loop is torch's, the cache transformers'."""
        return DynamicCache(config=self.config)

    def _get_logits_processor(self, *args, **kwargs):
        """transformers' logits processors, its temperature warper shifted by the row maximum first (the same
        distribution; a tiny temperature acts as greedy, as in the reference loop, instead of giving NaN)."""
        processors = super()._get_logits_processor(*args, **kwargs)
        for index, processor in enumerate(processors):
            if type(processor) is TemperatureLogitsWarper:
                processors[index] = _ShiftedTemperatureWarper(processor.temperature)
        return processors

    def prepare_inputs_for_generation(
        self, input_ids: Tensor, generation_state: GenerationState | None = None, **kwargs
    ):
        """transformers' inputs for the next step, with the values of the ids it passes on; the step asks the forward
        for the law of $U$ alone (on inputs checked at `generate`'s door: the loop runs under
        ``cauchy.validation(False)``)."""
        kwargs.pop("tokenizer", None)  # transformers' loop passes on the stop-string tokenizer; the model has no use
        inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        if generation_state is not None:
            generation_state.catch_up(input_ids)
            inputs["numeric_values"] = generation_state.values[:, -inputs["input_ids"].shape[1] :]
            inputs["return_decisions"] = False
        return inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs: dict, *args, **kwargs) -> dict:
        """transformers' update of the model kwargs; first, the step's ``logits``: the mode's scores at the last
        position, from the law of $U$ in ``outputs`` (`GenerationState.step_scores`)."""
        state = model_kwargs.get("generation_state")
        if state is not None:
            outputs["logits"] = state.step_scores(self.action, outputs)  # [B, 1, V]
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
