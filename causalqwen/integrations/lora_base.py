"""The base model a saved LoRA adapter records, written so that any working directory finds it, and read back.

peft writes the base's ``name_or_path`` into ``adapter_config.json`` (``base_model_name_or_path``), and
transformers keeps it as it was typed: a base loaded with ``from_pretrained("qwen-causal")`` would be recorded
as ``"qwen-causal"``, which means nothing from another directory (``AutoPeftModelForCausalLM`` then takes it for
a hub id), or another model where the working directory holds another ``qwen-causal``. So
``CausalQwenForCausalLM.from_pretrained`` of a local directory sets the model's ``name_or_path`` to the
directory's absolute, resolved path as it loads (`causalqwen.files.loading.strict_from_pretrained`): peft's own
``get_peft_model`` and ``save_pretrained`` record that. causalqwen's `causalqwen.integrations.lora`
(``add_lora``, ``load_lora``, ``save_lora``) records `portable_base` of it, which is the same path (and resolves
a relative name a model got elsewhere); a hub id stays a hub id.

Reading the record back (`adapter_base`, and `causalqwen.app.commands.load_base`, which loads the base) never goes
to the network:

- an absolute path must be an existing directory, or the error names it;
- a hub id (``owner/name``) is read from the local Hugging Face cache only (``local_files_only``), or the
  error says that no download is made;
- a relative path that is not a hub id (``"qwen-causal"``: an adapter saved before the record was made
  absolute) is refused. It was relative to the directory the saving process ran in, which the adapter does not
  record, so no guess is made: the message says to record the base's path with `record_base`, or to load the
  base and pass it to ``load_lora`` directly.
"""

from __future__ import annotations

import json
import os

from ..files.rundir import open_for_writing

__all__ = ["BASE_FIELD", "portable_base", "recorded_base", "adapter_base", "record_base", "read_adapter_config"]

BASE_FIELD = "base_model_name_or_path"  # the field of adapter_config.json that records the base
ADAPTER_CONFIG = "adapter_config.json"


def portable_base(name_or_path: str | None) -> str | None:
    """What an adapter records as its base: the absolute, resolved path of ``name_or_path`` when it names an
    existing local directory (from the current working directory, as ``from_pretrained`` read it); otherwise
    ``name_or_path`` unchanged (a hub id, or ``None`` for a model built in memory)."""
    if isinstance(name_or_path, str) and name_or_path and os.path.isdir(os.path.expanduser(name_or_path)):
        return os.path.realpath(os.path.expanduser(name_or_path))
    return name_or_path


def _adapter_config_file(adapter_dir) -> str:
    if not isinstance(adapter_dir, (str, os.PathLike)):
        raise TypeError(f"adapter_dir must be a str or os.PathLike, got {type(adapter_dir).__name__}")
    file = os.path.join(os.fspath(adapter_dir), ADAPTER_CONFIG)
    if not os.path.isfile(file):
        raise OSError(f"{os.fspath(adapter_dir)!r} holds no LoRA adapter: {ADAPTER_CONFIG} is missing")
    return file


def read_adapter_config(file: str) -> dict:
    """The JSON object in an adapter's config ``file``; anything else is an ``OSError`` naming the file."""
    try:
        with open(file, encoding="utf-8") as handle:
            content = json.load(handle)
    except (ValueError, UnicodeDecodeError) as error:
        raise OSError(f"{file!r} is not a valid peft adapter config: {error}") from error
    if not isinstance(content, dict):
        raise OSError(f"{file!r} is not a valid peft adapter config: not a JSON object")
    return content


def recorded_base(adapter_dir) -> str | None:
    """The base ``adapter_config.json`` records in ``adapter_dir``, as written (``None`` when none is)."""
    file = _adapter_config_file(adapter_dir)
    base = read_adapter_config(file).get(BASE_FIELD)
    if base is not None and not isinstance(base, str):
        raise ValueError(f"{file!r}: field {BASE_FIELD} must be a string, got {base!r}")
    return base or None


def _is_hub_id(text: str) -> bool:
    """Whether ``text`` has the form of a hub id (``owner/name``), as opposed to a relative directory path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if text.count("/") != 1 or text.startswith((".", "~")) or os.sep != "/" and os.sep in text:
        return False
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def adapter_base(adapter_dir) -> str:
    """Where the base of the adapter in ``adapter_dir`` loads from, without the network: an existing local
    directory (absolute) or a hub id (to be read from the local cache). ``OSError`` naming the adapter and the
    recorded base when it is an absolute path that is no directory; ``ValueError`` when nothing is recorded or
    the record is a relative path (module docstring: how to fix either)."""
    base = recorded_base(adapter_dir)
    where = os.fspath(adapter_dir)
    fix = (
        f"record the base's directory with causalqwen.integrations.lora_base.record_base({where!r}, BASE_DIR), "
        f"or load the base yourself and pass it to causalqwen.integrations.lora.load_lora(model, {where!r})"
    )
    if base is None:
        raise ValueError(f"the adapter in {os.fspath(adapter_dir)!r} records no base model ({BASE_FIELD}); {fix}")
    expanded = os.path.expanduser(base)
    if os.path.isabs(expanded):
        if not os.path.isdir(expanded):
            where = "is not a directory" if os.path.exists(expanded) else "does not exist"
            raise OSError(
                f"the base model {base!r} recorded by the adapter in {os.fspath(adapter_dir)!r} {where}; "
                f"if the base has moved, {fix}"
            )
        return expanded
    if _is_hub_id(base):
        return base
    raise ValueError(
        f"the adapter in {os.fspath(adapter_dir)!r} records its base as the relative path {base!r} (saved before "
        "causalqwen recorded absolute paths): relative to the directory the saving process ran in, which is not "
        f"recorded, so it is not guessed; {fix}"
    )


def record_base(adapter_dir, base_dir) -> str:
    """Record the existing local directory ``base_dir`` as the base of the adapter in ``adapter_dir``: its
    absolute, resolved path goes into ``adapter_config.json`` (field `BASE_FIELD`; the other fields untouched,
    the file never written through a link). Returns the recorded path. For an adapter saved with a relative
    base; the base must be the model the adapter was trained on (``load_lora`` checks every tensor's shape)."""
    if not isinstance(base_dir, (str, os.PathLike)):
        raise TypeError(f"base_dir must be a str or os.PathLike, got {type(base_dir).__name__}")
    file = _adapter_config_file(adapter_dir)
    path = os.path.realpath(os.path.expanduser(os.fspath(base_dir)))
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise OSError(f"base_dir {os.fspath(base_dir)!r} is not a saved model directory (no config.json in {path!r})")
    content = read_adapter_config(file)
    content[BASE_FIELD] = path
    with open_for_writing(file) as handle:
        json.dump(content, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return path
