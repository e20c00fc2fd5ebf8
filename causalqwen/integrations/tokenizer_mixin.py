"""What transformers asks of a tokenizer class, for `causalqwen.tokenization.NumericTokenizer`.

``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` calls ``from_pretrained`` (and
``register_for_auto_class``) of the class a directory's ``tokenizer_config.json`` names; ``Trainer`` saves the
tokenizer with ``save_pretrained`` and reads ``model_input_names`` and ``pad_token_id``; ``pipeline`` batching
reads and sets ``padding_side``. `TokenizerMixin` gives a class that wraps a Hugging Face tokenizer all of
these, from its ``hf_tokenizer`` and ``num_token`` and its constructor ``cls(hf_tokenizer, num_token=...)``.

The directory is the wrapped tokenizer's own (``tokenizer.json``, ``tokenizer_config.json``, ...), with
``<NUM>`` among its special added tokens, plus two entries in ``tokenizer_config.json``: ``num_token``, and
``auto_map``, which names the class through the directory's module (`causalqwen.integrations.auto`).
"""

from __future__ import annotations

import os

from transformers import AutoTokenizer

from ..files.checkpoint import check_local_source
from ..files.rundir import check_write_targets
from .auto import (
    AUTO_MODULE,
    TOKENIZER_AUTO_MAP,
    TOKENIZER_FILES,
    update_json,
    write_auto_module,
)

__all__ = ["TokenizerMixin"]


class TokenizerMixin:
    """Loading and saving a tokenizer directory, and the attributes transformers reads, for a class with the
    properties ``hf_tokenizer`` (the wrapped tokenizer) and ``num_token``."""

    model_input_names = ["input_ids", "numeric_values", "attention_mask"]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, num_token: str | None = None, **kwargs):
        """Load the wrapped tokenizer with ``AutoTokenizer.from_pretrained(path, **kwargs)`` and wrap it.

        ``num_token`` defaults to the one `save_pretrained` recorded in ``tokenizer_config.json``, else
        ``"<NUM>"``. This is also what ``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` calls
        for a directory `save_pretrained` wrote. A local path that does not exist, or tokenizer files that
        are missing or corrupt, raise an ``OSError`` that names the path (and the loader's reason, on one line).
        """
        where = os.fspath(path) if isinstance(path, os.PathLike) else path
        if isinstance(path, (str, os.PathLike)):
            check_local_source(path, "tokenizer")  # a missing local path never falls through to the hub
        kwargs.pop("trust_remote_code", None)  # the wrapped tokenizer is transformers' own class: no remote code
        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)
        except Exception as error:  # noqa: BLE001 -- the loaders raise many types, the Rust one a bare Exception
            raise OSError(f"cannot load a tokenizer from {where!r}: {' '.join(str(error).split())}") from error
        if num_token is None:
            recorded = getattr(hf_tokenizer, "num_token", None)  # transformers keeps a *_token entry as a special token
            num_token = str(recorded) if recorded is not None else "<NUM>"
        return cls(hf_tokenizer, num_token=num_token)

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
        update_json(config_file, {"num_token": self.num_token, "auto_map": dict(TOKENIZER_AUTO_MAP)})
        write_auto_module(path)
        return tuple(files) + (os.path.join(path, AUTO_MODULE + ".py"),)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoTokenizer") -> None:
        """What ``AutoTokenizer`` calls on a class it loaded from a directory's ``auto_map``. The directory
        already names this class (`save_pretrained`), so there is nothing to record."""

    @property
    def pad_token_id(self) -> int:
        """The id used at padded positions; a ValueError if the wrapped tokenizer has no pad token."""
        pad_token_id = self.hf_tokenizer.pad_token_id
        if pad_token_id is None:
            raise ValueError(
                "the wrapped tokenizer has no pad token; set hf_tokenizer.pad_token before padding a batch"
            )
        return pad_token_id

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id of the wrapped tokenizer (None if it has none)."""
        return self.hf_tokenizer.eos_token_id

    @property
    def padding_side(self) -> str:
        """The wrapped tokenizer's ``padding_side``, where transformers' batching (``pipeline`` with
        ``batch_size``) pads; ``__call__`` takes its own ``padding_side`` argument."""
        return self.hf_tokenizer.padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f'padding_side must be "left" or "right", got {side!r}')
        self.hf_tokenizer.padding_side = side
