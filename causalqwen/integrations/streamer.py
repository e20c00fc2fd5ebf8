r"""A transformers `TextStreamer` that writes the generated numbers: `NumericTextStreamer`.

transformers' loop hands a streamer the ids alone (``put(ids)``: the prompt, then each new token), so its
`TextStreamer` writes a generated number as the text of the ``<NUM>`` token. The values travel beside the ids, in
the `GenerationState` of `CausalQwenGenerationMixin.generate`. The protocol, one method: a streamer that has
``attach_generation_state(state)`` is handed the state by ``generate`` before the prompt, and reads there the value
of each token it is given (`GenerationState.values` for the tokens the state holds; `GenerationState.chosen_values`
for the one chosen after the last step). ``generate`` itself adds no host synchronisation; the streamer reads a
value (one synchronisation) only for a ``<NUM>`` token, as transformers' streamer reads each token.

The text: at each token the streamer decodes everything so far with `NumericTokenizer.decode_continuation` and
writes what cannot change any more (up to the last whitespace, or a CJK character at the end); `end` writes the
rest. So the streamed continuation is the continuation `NumericTextGenerationPipeline` returns
(``return_full_text=False``): ``tokenizer.decode(out.sequences[0, S:], out.numeric_values[0, S:])`` of the same
call -- and, where the first generated number or digit would run into the prompt's last number, a space in front,
so that the prompt then the stream reads every number back. With ``skip_prompt=False`` the prompt is written first,
its numbers as they were written (``"12.50"``, where the values say 12.5). How they were written travels explicitly,
never from a memory of earlier calls: ``model.generate(**enc, number_texts=enc.number_texts, streamer=...)`` (the
`GenerationState` carries them), or ``NumericTextStreamer(tokenizer, number_texts=enc.number_texts[0])``. Generated
numbers are written at ``number_resolution="prompt"`` by default (`causalqwen.writing`), as the pipeline and
``causalqwen generate`` write them, which needs those texts where the prompt holds a number (a ``ValueError`` before
the first step otherwise); with ``number_resolution=None`` or a power of ten a prompt given without them is written
from its values (``"12.5"``).
"""

from __future__ import annotations

import torch
from transformers import TextStreamer

from ..checks.tokenizer_door import check_number_text_count, checked_number_texts
from ..float32 import format_number
from ..writing import check_resolution

__all__ = ["NumericTextStreamer"]


class NumericTextStreamer(TextStreamer):
    """transformers' `TextStreamer` for a CausalQwen model: ``model.generate(**enc, streamer=
    NumericTextStreamer(tokenizer, skip_prompt=True))`` prints the generated text with every generated number written
    out, as ``tokenizer.decode`` with the values writes it (see the module).

    Args:
        tokenizer: the `NumericTokenizer` (anything with its ``decode_continuation``).
        skip_prompt: write only what is generated (default False: the prompt first, as transformers' streamer, its
            numbers as they were written; see the module).
        **decode_kwargs: passed to ``decode_continuation``: ``skip_special_tokens``, ``out_of_vocab`` (default here
            ``"mark"``: an untrained model's reserved row is written ``<unk:ID>`` instead of failing mid-stream, as
            the pipeline does), ``number_resolution`` (default here ``"prompt"``, as the pipeline; None writes every
            float32 digit), ``number_texts`` (the prompt's numbers as written, a list of str: ``enc.number_texts[0]``;
            else those given to ``generate``; each one number of the grammar, and exactly one per ``<NUM>`` of the
            prompt, refused as the prompt arrives otherwise).

    Every argument is checked here, when the streamer is built (a ``TypeError`` or ``ValueError`` naming it), not
    once ``generate`` has started. Batch size 1 only, as transformers' `TextStreamer` (a ValueError otherwise).
    Override `on_finalized_text` to send the text elsewhere than stdout.
    """

    def __init__(self, tokenizer, skip_prompt: bool = False, **decode_kwargs):
        if not callable(getattr(tokenizer, "decode_continuation", None)):
            raise TypeError(
                f"NumericTextStreamer needs a NumericTokenizer (with decode_continuation), got "
                f"{type(tokenizer).__name__}"
            )
        self.given_number_texts = _checked_arguments(skip_prompt, decode_kwargs)
        super().__init__(
            tokenizer,
            skip_prompt=skip_prompt,
            **({"out_of_vocab": "mark", "number_resolution": "prompt"} | decode_kwargs),
        )
        self.state = None  # the GenerationState of the running generate call
        self.value_cache: list[float] = []  # beside token_cache: the prompt's ids, then every generated one
        self.prompt_length = 0
        self.prompt_number_texts: list[str] = []  # the prompt's numbers as written

    def attach_generation_state(self, state) -> None:
        """Called by ``CausalQwenGenerationMixin.generate`` before the prompt: where the values are read."""
        if state.values.shape[0] != 1:
            raise ValueError(
                f"NumericTextStreamer supports batch size 1 only (as transformers' TextStreamer); got "
                f"{state.values.shape[0]} rows: generate each prompt alone, or stream nothing"
            )
        self.state = state
        self.token_cache, self.value_cache, self.print_len, self.next_tokens_are_prompt = [], [], 0, True

    def put(self, value) -> None:
        """Take the prompt's ids ``[1, S]`` or a new token ``[1]``, read their values, write what is settled."""
        if self.state is None:
            raise RuntimeError(
                "NumericTextStreamer has no values to read: use it as model.generate(..., streamer=...)"
                " of a CausalQwen model, whose generate hands it the values of the <NUM> tokens"
            )
        if value.dim() > 1 and value.shape[0] > 1:
            raise ValueError(f"NumericTextStreamer supports batch size 1 only; got {value.shape[0]} rows")
        ids = (value[0] if value.dim() > 1 else value).tolist()
        self.value_cache.extend(self.values_of(ids, len(self.token_cache)))
        self.token_cache.extend(ids)
        if self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            self.prompt_length = len(ids)
            self.prompt_number_texts = self.number_texts_of_prompt(ids, self.value_cache)
            if not self.skip_prompt:
                self.on_finalized_text(self.texts()[0])
            return
        text = self.texts()[1]
        settled = len(text) if text and self._is_chinese_char(ord(text[-1])) else last_whitespace(text) + 1
        if settled > self.print_len:
            self.on_finalized_text(text[self.print_len : settled])
            self.print_len = settled

    def end(self) -> None:
        """Write the rest of the continuation and end the line; ready for the next ``generate``."""
        text = self.texts()[1] if self.token_cache else ""
        self.on_finalized_text(text[self.print_len :], stream_end=True)
        self.token_cache, self.value_cache, self.print_len, self.next_tokens_are_prompt = [], [], 0, True
        self.state = None

    def values_of(self, ids: list[int], position: int) -> list[float]:
        """The values of ``ids``, the tokens from ``position`` on: those the state holds already (the prompt; with
        transformers' deferred stop test, a token given one step late), then the token chosen after the last step."""
        held_count = min(max(self.state.values.shape[1] - position, 0), len(ids))
        held = self.state.values[0, position : position + held_count].tolist() if held_count else []
        if held_count == len(ids):
            return held
        # one token the state has not appended yet: its value is read (a host synchronisation) only for <NUM>
        token = ids[-1]
        value = 0.0 if token != self.state.num_token_id else self.state.chosen_values(torch.tensor([token]))[0].item()
        return held + [value]

    def number_texts_of_prompt(self, ids: list[int], values: list[float]) -> list[str]:
        """How the prompt's numbers were written: the ``number_texts`` given to the streamer, else those given to
        ``generate`` (the state's); without either, a ``ValueError`` at ``number_resolution="prompt"`` for a prompt
        that holds a number, else the shortest text of each value (``"12.5"`` for ``"12.50"``)."""
        texts = self.given_number_texts
        if texts is None and self.state.number_texts is not None:
            texts = self.state.number_texts[0]
        if texts is not None:
            try:  # refused here, as the prompt arrives, before the first step: too few would rewrite its numbers
                check_number_text_count(len(texts), ids, self.state.num_token_id, prompt_length=len(ids))
            except ValueError as error:
                raise ValueError(f"row 0: {error}") from None
            return list(texts)
        numbers = [format_number(value) for token, value in zip(ids, values) if token == self.state.num_token_id]
        if numbers and self.decode_kwargs["number_resolution"] == "prompt":
            raise ValueError(
                "NumericTextStreamer writes generated numbers at the resolution of the prompt's numbers as they "
                "were written, which the ids and values do not say (12.50 and 12.5 are one value): pass "
                "number_texts=enc.number_texts to generate, or number_texts=enc.number_texts[0] to the streamer "
                "(or number_resolution=None)"
            )
        return numbers

    def texts(self) -> tuple[str, str]:
        """``(prompt, continuation)`` of everything so far, as `NumericTokenizer.decode_continuation` writes them."""
        return self.tokenizer.decode_continuation(
            self.token_cache,
            self.value_cache,
            self.prompt_length,
            number_texts=self.prompt_number_texts,
            **self.decode_kwargs,
        )


_DECODE_ARGUMENTS = ("skip_special_tokens", "out_of_vocab", "number_resolution", "number_texts")


def _checked_arguments(skip_prompt, decode_kwargs: dict) -> list[str] | None:
    """The streamer's arguments, checked when it is built: ``skip_prompt`` and ``skip_special_tokens`` bools,
    ``out_of_vocab`` ``"raise"`` or ``"mark"``, ``number_resolution`` as `causalqwen.writing.check_resolution` takes
    it, no other keyword; returns ``number_texts`` (None, or a list of number texts,
    `causalqwen.checks.tokenizer_door.checked_number_texts`), taken out of ``decode_kwargs``."""
    unknown = sorted(set(decode_kwargs) - set(_DECODE_ARGUMENTS))
    if unknown:
        raise TypeError(
            f"NumericTextStreamer got unexpected keyword argument(s) {unknown}; it takes {_DECODE_ARGUMENTS}"
        )
    for name, value in (
        ("skip_prompt", skip_prompt),
        ("skip_special_tokens", decode_kwargs.get("skip_special_tokens")),
    ):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if decode_kwargs.get("out_of_vocab", "mark") not in ("raise", "mark"):
        raise ValueError(f'out_of_vocab must be "raise" or "mark", got {decode_kwargs["out_of_vocab"]!r}')
    if "number_resolution" in decode_kwargs:
        check_resolution(decode_kwargs["number_resolution"])
    number_texts = decode_kwargs.pop("number_texts", None)
    return None if number_texts is None else checked_number_texts(number_texts)


def last_whitespace(text: str) -> int:
    """The index of the last whitespace character of ``text``; -1 if none. The text up to it is settled: a number
    followed by a space reads the same whatever comes after."""
    for index in range(len(text) - 1, -1, -1):
        if text[index].isspace():
            return index
    return -1
