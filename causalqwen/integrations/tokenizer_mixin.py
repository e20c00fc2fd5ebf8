"""What transformers asks of a tokenizer class, for `causalqwen.integrations.tokenizer.NumericTokenizer`.

``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` calls ``from_pretrained`` (and
``register_for_auto_class``) of the class a directory's ``tokenizer_config.json`` names; ``Trainer`` saves the
tokenizer with ``save_pretrained`` and reads ``model_input_names`` and ``pad_token_id``; ``pipeline`` batching
reads and sets ``padding_side``. `TokenizerMixin` gives a class that wraps a Hugging Face tokenizer all of
these, from its ``hf_tokenizer`` and ``num_token`` and its constructor ``cls(hf_tokenizer, num_token=...)``.

The directory is the wrapped tokenizer's own (``tokenizer.json``, ``tokenizer_config.json``, ...), with
``<NUM>`` among its special added tokens, plus entries in ``tokenizer_config.json``: ``num_token``,
``padding_side``, and
``auto_map``, which names the class through the directory's module (`causalqwen.integrations.auto`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping

from transformers import AutoTokenizer

from ..checks.tokenizer_door import NUM_TOKEN_FIX, check_max_length, check_text, num_token_clash
from ..files.checkpoint import check_local_source
from ..files.rundir import check_write_targets
from ..tokenization import first_tokens
from .auto import (
    AUTO_MODULE,
    TOKENIZER_AUTO_MAP,
    TOKENIZER_FILES,
    update_json,
    write_auto_module,
)
from .chat_template import apply_chat_template
from .collator import NumericDataCollator

__all__ = ["TokenizerMixin"]


# the model type of a CausalQwen config.json (`causalqwen.configuration.CausalQwenConfig.model_type`), not imported:
# the tokenizer loads without the model's modules
_MODEL_TYPE = "causal_qwen"


class _ModelTypeNotice(logging.Filter):
    """Drops transformers' notice that a CausalQwen ``config.json`` is read as a plain config."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"model of type `{_MODEL_TYPE}`" not in record.getMessage()


@contextlib.contextmanager
def _no_model_type_notice():
    """Inside this block, transformers' configuration logger drops its notice "You are using a model of type
    `causal_qwen` to instantiate a model of type ``" and nothing else. ``AutoTokenizer`` reads a directory's
    ``config.json`` only to guess the tokenizer class (``tokenizer_config.json`` names it); where the CausalQwen
    config class is not registered (the tokenizer loaded alone) it reads the file as a plain config and gives that
    notice, which says nothing about the tokenizer."""
    config_logger = logging.getLogger("transformers.configuration_utils")
    notice = _ModelTypeNotice()
    config_logger.addFilter(notice)
    try:
        yield
    finally:
        config_logger.removeFilter(notice)


class TokenizerMixin:
    """Loading and saving a tokenizer directory, and the attributes transformers reads, for a class with the
    properties ``hf_tokenizer`` (the wrapped tokenizer) and ``num_token``."""

    # -- encoding one text ----------------------------------------------------------------------

    def encode(
        self, text: str, max_length: int | None = None, return_number_texts: bool = False, **unknown
    ) -> tuple[list[int], list[float]] | tuple[list[int], list[float], list[str]]:
        """Encode one text into ``(input_ids, numeric_values)`` of equal length.

        Each quantity (see `causalqwen.numbers`) becomes one ``<NUM>`` id, with its float32 value at
        the same position of ``numeric_values``; every other position holds 0.0. The text between
        numbers is encoded by the wrapped tokenizer, piece by piece, without special tokens. No
        spaces are added around numbers. With ``return_number_texts=True`` a third list holds the
        surface text of each ``<NUM>``, in order (what `decode` needs to give back ``text``).

        With ``max_length``, at most that many tokens are returned, and the wrapped tokenizer encodes only
        a prefix of the text, of about 16 characters per token, grown until it gives more than
        ``max_length`` tokens: so a 50 MB text costs what its first tokens cost, whatever it holds (a
        base64 blob, Chinese without spaces, one long digit run). The prefix ends at a space that follows
        a non-space character (where neither the number grammar nor a byte-level BPE pre-tokenizer joins
        across), else where no number reads across (a cut place of `causalqwen.numbers`), else anywhere.
        Its numbers are always the whole text's: where the grammar must look further to decide one (the
        "1" of "1a1a...1a_" is a number only because of the final "_"), it does, in time linear in the text.
        The tokens are those of the whole text: the first ``max_length`` of them.

        Raises:
            TypeError: ``text`` is not a str, or a keyword of transformers' ``encode`` (``add_special_tokens``), whose
                callers expect ids alone.
            ValueError: the text holds a lone surrogate (not valid Unicode: the message names the
                character), or it is longer than `MAX_TEXT_CHARS` and no ``max_length`` bounds it.
        """
        if unknown:  # transformers' encode(text, add_special_tokens=...) returns ids alone: its caller loses values
            raise TypeError(
                f"NumericTokenizer.encode() got unexpected keyword argument(s) {sorted(unknown)}: it returns "
                "(ids, values), not the ids alone that transformers' encode returns; a caller that passes ids only "
                "loses every number "
                "(lm-eval: use --model causalqwen, python -m causalqwen.app.lm_eval_adapter, not --model hf)"
            )
        check_text(text, max_length)
        max_length = check_max_length(max_length)
        row = self._encode_texts([text], max_length)[0]
        if max_length is not None:
            row = first_tokens(row, max_length, self.num_token_id)
        return tuple(row) if return_number_texts else (row.input_ids, row.numeric_values)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings, as transformers' ``tokenize`` gives them: the wrapped tokenizer's
        tokens of the text between numbers (``"Ġcosts"``), and ``num_token`` (``"<NUM>"``) for each number. The
        tokens of `encode` (`convert_ids_to_tokens` of its ids); the values are not in strings: `encode` gives them.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: as `encode`.
        """
        return self.convert_ids_to_tokens(self.encode(text)[0])

    model_input_names = ["input_ids", "numeric_values", "attention_mask"]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, num_token: str | None = None, **kwargs):
        """Load the wrapped tokenizer with ``AutoTokenizer.from_pretrained(path, **kwargs)`` and wrap it.

        ``num_token`` defaults to the one `save_pretrained` recorded in ``tokenizer_config.json``, else
        ``"<NUM>"``. This is also what ``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` calls
        for a directory `save_pretrained` wrote. A local path that does not exist, or tokenizer files that
        are missing or corrupt, raise an ``OSError`` that names the path (and the loader's reason, on one line).
        A ``tokenizer_config.json`` whose ``num_token`` is another token of the wrapped tokenizer (its end of
        text, its pad token, a chat template's special token, an ordinary token) is a ``ValueError`` naming the
        file, the token and the clash (`causalqwen.checks.tokenizer_door.num_token_clash`).
        """
        where = os.fspath(path) if isinstance(path, os.PathLike) else path
        if isinstance(path, (str, os.PathLike)):
            check_local_source(path, "tokenizer")  # a missing local path never falls through to the hub
        kwargs.pop("trust_remote_code", None)  # the wrapped tokenizer is transformers' own class: no remote code
        try:
            with _no_model_type_notice():
                hf_tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)
        except Exception as error:  # noqa: BLE001 -- the loaders raise many types, the Rust one a bare Exception
            raise OSError(f"cannot load a tokenizer from {where!r}: {' '.join(str(error).split())}") from error
        recorded = getattr(hf_tokenizer, "num_token", None)  # transformers keeps a *_token entry as a special token
        if num_token is None and recorded is not None:  # the file names it: a clash is the file's, named so
            num_token = str(recorded)
            clash = num_token_clash(hf_tokenizer, num_token)
            if clash is not None:
                config_file = (
                    os.path.join(where, "tokenizer_config.json")
                    if os.path.isdir(where)
                    else (f"tokenizer_config.json of {where}")
                )
                raise ValueError(
                    f"{config_file!r} names num_token {num_token!r}, which is {clash}: numbers would "
                    f"encode as that token; {NUM_TOKEN_FIX}, and write it there"
                )
        num_token = "<NUM>" if num_token is None else num_token  # a num_token argument is checked by the constructor
        padding_side = hf_tokenizer.init_kwargs.get("padding_side") or "left"  # recorded by save_pretrained
        return cls(hf_tokenizer, num_token=num_token, padding_side=padding_side)

    def save_pretrained(self, path: str | os.PathLike, **kwargs) -> tuple[str, ...]:
        """Save the wrapped tokenizer, ``<NUM>`` included, with its ``save_pretrained(path, **kwargs)``, and
        name this class in ``tokenizer_config.json``: ``num_token``, and ``auto_map`` so that
        ``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` gives this class (see
        `causalqwen.integrations.auto`); without ``trust_remote_code`` it gives the wrapped tokenizer, which knows
        ``<NUM>`` as its special ``num_token``.

        ``path`` must be a directory or not exist yet (an existing file is an ``OSError`` naming it), and is
        never written through a link: ``path`` itself, or a name the save writes (``tokenizer_config.json``,
        ``tokenizer.json``, ...), being a symbolic link or a hard-linked file is an ``OSError`` naming it,
        raised before anything is written (`causalqwen.files.rundir.check_write_targets`)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        check_write_targets(path, TOKENIZER_FILES)  # OSError for a link, a file in place of the directory
        files = self.hf_tokenizer.save_pretrained(path, **kwargs)
        if files is None:  # transformers logs and returns None when it writes nothing
            raise OSError(f"the tokenizer could not be saved to {os.fspath(path)!r}")
        config_file = next((file for file in files if os.path.basename(file) == "tokenizer_config.json"), None)
        if config_file is None:
            raise RuntimeError(f"the wrapped tokenizer wrote no tokenizer_config.json to {os.fspath(path)!r}")
        update_json(
            config_file,
            {"num_token": self.num_token, "padding_side": self.padding_side, "auto_map": dict(TOKENIZER_AUTO_MAP)},
        )
        write_auto_module(path)
        return tuple(files) + (os.path.join(path, AUTO_MODULE + ".py"),)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoTokenizer") -> None:
        """What ``AutoTokenizer`` calls on a class it loaded from a directory's ``auto_map``. The directory
        already names this class (`save_pretrained`), so there is nothing to record."""

    def apply_chat_template(self, conversation, add_generation_prompt: bool = False, tokenize: bool = True, **kwargs):
        """The wrapped tokenizer's chat template, then numbers as ``<NUM>`` and values: a `NumericEncoding` whose
        template special tokens (``<|im_start|>``, ...) keep their special ids, or with ``tokenize=False`` the
        rendered text (`causalqwen.integrations.chat_template.apply_chat_template`)."""
        return apply_chat_template(self, conversation, add_generation_prompt, tokenize, **kwargs)

    def pad(
        self,
        encoded_inputs,
        padding: bool | str = True,
        max_length: int | None = None,
        *,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        verbose: bool = True,
    ):
        """Pad features as transformers' ``tokenizer.pad`` does, ``numeric_values`` (with 0.0) beside the ids, so that
        the stock ``DataCollatorWithPadding(tokenizer)`` pads numbers too: a list of dicts (or a dict of lists) with
        ``input_ids`` and ``numeric_values`` (``attention_mask``, ``labels`` -- padded with -100 -- and
        ``numeric_labels`` where present), by `causalqwen.integrations.collator.NumericDataCollator`;
        ``padding_side`` defaults to `padding_side`. ``padding=False`` is refused (transformers' ``pad`` then
        returns the rows as they are: use them so). Its ``number_texts`` are None: features do not say how their
        numbers were written."""
        if isinstance(encoded_inputs, Mapping):  # a dict of lists (a batch), as transformers' pad takes too
            keys = list(encoded_inputs)
            encoded_inputs = [dict(zip(keys, values)) for values in zip(*(encoded_inputs[key] for key in keys))]
        if padding not in (True, "longest", "max_length"):
            raise ValueError(f"pad needs padding=True, 'longest' or 'max_length', got {padding!r}")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        collator = NumericDataCollator(
            self,
            padding_side=padding_side or self.padding_side,
            pad_to_multiple_of=pad_to_multiple_of,
            return_tensors=return_tensors,
            max_length=max_length if padding == "max_length" else None,
        )
        batch = collator(encoded_inputs)
        if return_attention_mask is False:
            del batch["attention_mask"]
        return self.encoding_class(batch, None)  # features carry no number texts: how their numbers were written

    # -- special tokens and vocabulary, as the wrapped tokenizer has them (None where it has none) --

    @property
    def pad_token(self) -> str | None:
        """The wrapped tokenizer's pad token (None if it has none); setting it sets the wrapped tokenizer's, as in
        the transformers habit ``tokenizer.pad_token = tokenizer.eos_token``."""
        return self.hf_tokenizer.pad_token

    @pad_token.setter
    def pad_token(self, token: str | None) -> None:
        self.hf_tokenizer.pad_token = token

    @property
    def pad_token_id(self) -> int | None:
        """The id used at padded positions (None if the wrapped tokenizer has no pad token: padding a batch of
        rows of different lengths is then a ValueError)."""
        return self.hf_tokenizer.pad_token_id

    @property
    def eos_token(self) -> str | None:
        """The end-of-sequence token of the wrapped tokenizer (None if it has none)."""
        return self.hf_tokenizer.eos_token

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id of the wrapped tokenizer (None if it has none)."""
        return self.hf_tokenizer.eos_token_id

    @property
    def bos_token(self) -> str | None:
        """The beginning-of-sequence token of the wrapped tokenizer (None if it has none, as Qwen2's)."""
        return self.hf_tokenizer.bos_token

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id of the wrapped tokenizer (None if it has none)."""
        return self.hf_tokenizer.bos_token_id

    @property
    def unk_token(self) -> str | None:
        """The unknown token of the wrapped tokenizer (None if it has none)."""
        return self.hf_tokenizer.unk_token

    @property
    def unk_token_id(self) -> int | None:
        """The unknown-token id of the wrapped tokenizer (None if it has none)."""
        return self.hf_tokenizer.unk_token_id

    @property
    def all_special_tokens(self) -> list[str]:
        """The special tokens of the wrapped tokenizer as it came (eos, pad, ... and additional ones), then
        ``num_token`` (the same before and after `save_pretrained`, which records it as a named special token)."""
        tokens = [token for token in self.hf_tokenizer.all_special_tokens if token != self.num_token]
        return tokens + [self.num_token]

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of `all_special_tokens`, ``<NUM>``'s last."""
        return self.hf_tokenizer.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def special_tokens_map(self) -> dict:
        """The wrapped tokenizer's named special tokens (``{"eos_token": ..., "pad_token": ...}``)."""
        return self.hf_tokenizer.special_tokens_map

    @property
    def vocab_size(self) -> int:
        """The wrapped tokenizer's base vocabulary size, added tokens (``<NUM>`` among them) not counted, as
        transformers' ``vocab_size``; ``len(tokenizer)`` counts them."""
        return self.hf_tokenizer.vocab_size

    @property
    def model_max_length(self) -> int:
        """The wrapped tokenizer's ``model_max_length``."""
        return self.hf_tokenizer.model_max_length

    @property
    def name_or_path(self) -> str:
        """Where the wrapped tokenizer was loaded from."""
        return self.hf_tokenizer.name_or_path

    def get_vocab(self) -> dict[str, int]:
        """Token to id, added tokens (``<NUM>``) included."""
        return self.hf_tokenizer.get_vocab()

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """The tokens of ids (one int, or a list), as the wrapped tokenizer writes them; the ``<NUM>`` id gives
        ``num_token`` (its value is not in an id: `decode` with ``numeric_values`` writes it)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self.hf_tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        """The ids of tokens (one str, or a list), as the wrapped tokenizer gives them."""
        return self.hf_tokenizer.convert_tokens_to_ids(tokens)

    @property
    def padding_side(self) -> str:
        """Where ``__call__`` pads when its ``padding_side`` is None, and where transformers' batching
        (``pipeline`` with ``batch_size``) pads: this wrapper's own setting, from the constructor (``"left"`` by
        default, what batched generation needs). Setting it changes neither the wrapped tokenizer's
        ``padding_side`` nor another wrapper's."""
        return self._padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f'padding_side must be "left" or "right", got {side!r}')
        self._padding_side = side
