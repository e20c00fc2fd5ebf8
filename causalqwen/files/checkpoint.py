r"""What causalqwen reads from disk, and the checks it makes before trusting it.

A checkpoint is data, never code. This module is the one door through which weights and training
state come in:

- **Safetensors only.** Weights load from ``model.safetensors`` or from the shards that
  ``model.safetensors.index.json`` names; a directory that holds only a pickled
  ``pytorch_model.bin`` (or a ``training_state.pt`` of an older causalqwen) is refused, not unpickled.
- **Inside its directory.** A shard name in the index must be a plain relative path that stays inside
  the checkpoint directory: no absolute path, no ``..``.
- **Sizes before allocation.** The configuration is checked against the safetensors *headers*
  (`check_sizes_against_headers`) before a model is built, so a ``config.json`` that announces a
  vocabulary of $10^{12}$ rows fails in milliseconds instead of allocating it.
- **Complete and well-typed.** After loading, every tensor of the model must come from the
  checkpoint, with its shape, a floating-point dtype for a floating-point parameter, and finite
  values (`state_problems`).
- **One value check.** Every loader (``from_pretrained``, `load_weights_strictly`, the training state's
  `causalqwen.files.training_state`, ``load_lora``, ``load_abduction``, the divergence bound's reference)
  applies `value_problem` to each tensor: floating point where a float belongs (never cast from an integer),
  and finite *in the dtype it is loaded into* -- a float64 1e300 is finite in the file but inf in a float32
  parameter.
- **Training state without pickle.** The optimizer's tensors and the RNG states are written to
  ``training_state.safetensors``, everything else to ``trainer_state.json``
  (`causalqwen.files.training_state`), and every file is fsynced before the checkpoint directory is renamed
  into place (`fsync_tree`).

Every failure is an ``OSError`` (a file that is not what it should be) or a ``ValueError`` (a
setting that does not fit) whose message names the file and the tensor or field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

__all__ = [
    "check_local_source",
    "SAFE_WEIGHTS",
    "SAFE_INDEX",
    "PICKLED_FILES",
    "weight_files",
    "check_readable",
    "header_shapes",
    "check_sizes_against_headers",
    "expected_state_shapes",
    "value_problem",
    "state_problems",
    "load_weights_strictly",
    "fsync_tree",
    "fsync_directory",
]

# The JSON files of a model or tokenizer directory that the loaders read; `check_local_source` parses those present.
SOURCE_JSON_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)
_checked_json: dict[tuple, None] = {}  # (path, size, mtime) of files found valid, so that each is parsed once


def _check_json_file(file: str) -> None:
    """``OSError`` naming ``file`` unless it is UTF-8 JSON that Python reads (with the line and column, or the
    byte, of the first fault)."""
    stat = os.stat(file)
    key = (os.path.realpath(file), stat.st_size, stat.st_mtime_ns)
    if key in _checked_json:
        return
    with open(file, "rb") as handle:
        data = handle.read()
    try:
        json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise OSError(
            f"{file!r} is not UTF-8 text (invalid byte {data[error.start]:#04x} at offset {error.start})"
        ) from None
    except json.JSONDecodeError as error:
        raise OSError(f"{file!r} is not valid JSON ({error.msg}: line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise OSError(f"{file!r} cannot be read: the JSON is nested too deeply") from None
    except ValueError as error:  # a number Python does not convert (an integer beyond its digit limit)
        raise OSError(f"{file!r} cannot be read: {' '.join(str(error).split())}") from None
    _checked_json[key] = None


def check_local_source(source, what: str) -> None:
    """An ``OSError`` naming ``source`` when it is meant as a local directory and there is none, or when a
    JSON file of that directory is corrupt.

    ``source`` (a path, or a string for a path or a hub id) is taken for a local path when it is an
    ``os.PathLike``, absolute, starts with ``.`` or ``~``, has no ``/`` (``model_nope``: a hub id has the
    form ``owner/name``), cannot be a hub id (``a/b/c``, spaces), or its first component is a local
    directory (``runs/missing`` next to ``runs/``). Such a source that is not a directory never reaches
    the hub, where it would cost network retries and an error about the hub instead of the path. A
    string ``owner/name`` with no such directory is left to the loader: a hub id, read from the local
    Hugging Face cache or downloaded; with ``HF_HUB_OFFLINE=1`` one that is not in the cache is an
    ``OSError`` here, naming it.

    For an existing directory, each of `SOURCE_JSON_FILES` present there is parsed (once per version
    of the file), so that a corrupt ``tokenizer.json`` or ``config.json`` is named with its line and
    column, rather than reported by a loader that names only the directory.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    text = os.fspath(source)
    expanded = os.path.expanduser(text)
    if os.path.isdir(expanded):
        for name in SOURCE_JSON_FILES:
            if os.path.isfile(os.path.join(expanded, name)):
                _check_json_file(os.path.join(text, name))
        return
    slashed = text.replace(os.sep, "/")
    local = isinstance(source, os.PathLike) or os.path.isabs(text) or text.startswith((".", "~"))
    hint = ""
    if not local and "/" not in slashed:
        local, hint = True, " (a hub id has the form owner/name, e.g. Qwen/Qwen2.5-0.5B)"
    if not local:
        try:
            validate_repo_id(text)
        except HFValidationError:
            local = True
    head = slashed.split("/")[0]
    if local or ("/" in slashed and os.path.isdir(head)):
        where = "exists but is not a directory" if os.path.exists(expanded) else f"does not exist{hint}"
        raise OSError(f"{what} directory {text!r} {where}")
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not any(  # offline: a hub id must be in the cache; say so without a lookup
        isinstance(try_to_load_from_cache(text, name), str) for name in ("config.json", "tokenizer_config.json")
    ):
        raise OSError(
            f"{what} {text!r} is no local directory and, with HF_HUB_OFFLINE=1, not in the local "
            "Hugging Face cache either"
        )


SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
# Files that other tools write as pickles. causalqwen never loads them; their presence only improves the error.
PICKLED_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "training_state.pt", "optimizer.pt")


# =============================================================================================
# Weight files: which ones, and are they readable
# =============================================================================================


def _confined_name(index: str, name) -> str:
    """``name`` as a path relative to the index's directory; ``OSError`` unless it stays inside it."""
    if not isinstance(name, str) or not name:
        raise OSError(f"the checkpoint index {index!r} names a shard that is not a file name: {name!r}")
    normal = os.path.normpath(name)
    if os.path.isabs(name) or os.path.isabs(normal) or normal == ".." or normal.startswith(".." + os.sep):
        raise OSError(
            f"the checkpoint index {index!r} names the shard {name!r} outside its directory; "
            "shards must be plain relative file names"
        )
    return normal


def weight_files(path, subfolder: str = "") -> list[str]:
    """The safetensors files a local checkpoint directory provides (``[]`` for a hub id).

    ``model.safetensors`` if present, else the shards named by ``model.safetensors.index.json``, each
    confined to the directory. A local directory with neither is an ``OSError`` (that names a pickled
    ``pytorch_model.bin`` if one is there: it is never loaded).
    """
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return []
    directory = os.path.join(path, subfolder or "")
    single = os.path.join(directory, SAFE_WEIGHTS)
    if os.path.isfile(single):
        return [single]
    index = os.path.join(directory, SAFE_INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as handle:
                weight_map = json.load(handle)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise OSError(f"the checkpoint index {index!r} is not a valid safetensors index: {error}") from error
        files = [os.path.join(directory, _confined_name(index, shard)) for shard in shards]
        for file in files:
            if not os.path.isfile(file):
                raise OSError(f"the checkpoint index {index!r} names {os.path.basename(file)!r}, which does not exist")
        return files
    pickled = [name for name in PICKLED_FILES if os.path.exists(os.path.join(directory, name))]
    hint = f"; it holds {', '.join(pickled)} (pickle), which causalqwen never loads" if pickled else ""
    raise OSError(f"the checkpoint directory {str(directory)!r} holds no {SAFE_WEIGHTS} or {SAFE_INDEX}{hint}")


def check_readable(file: str) -> None:
    """Raise ``OSError`` naming ``file`` unless its safetensors header parses and covers the file exactly."""
    try:
        with safe_open(file, framework="pt") as handle:
            handle.keys()
    except SafetensorError as error:
        raise OSError(f"the safetensors file {file!r} cannot be read: {error} (truncated or corrupt file)") from error


def header_shapes(files: Iterable[str]) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """``{name: (shape, dtype, file)}`` from the safetensors headers alone (no tensor is read)."""
    shapes = {}
    for file in files:
        check_readable(file)
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():
                piece = handle.get_slice(key)
                shapes[key] = (tuple(piece.get_shape()), piece.get_dtype(), file)
    return shapes


# =============================================================================================
# Sizes against headers, before a model is built
# =============================================================================================


def _layer_count(keys: Iterable[str], prefix: str) -> int:
    layers = {int(m.group(1)) for key in keys if (m := re.match(re.escape(prefix) + r"layers\.(\d+)\.", key))}
    return max(layers) + 1 if layers else 0


def check_sizes_against_headers(config, shapes: dict, prefix: str = "model.") -> None:
    """Compare the sizes a config announces with the tensors its weight files hold, before allocating.

    Checks ``vocab_size`` and ``hidden_size`` against the embedding, ``intermediate_size`` against
    the first MLP and ``num_hidden_layers`` against the layers present. These are the fields that
    make a model large; everything else is compared tensor by tensor after a meta-device build
    (`expected_state_shapes`). ``shapes`` is `header_shapes` of the weight files. Raises ``ValueError``
    naming the field, the file and both sizes.
    """
    first_file = next(iter(shapes.values()))[2] if shapes else "the checkpoint"
    embed = shapes.get(prefix + "embed_tokens.weight")
    if embed is None:
        raise OSError(f"the checkpoint {first_file!r} holds no {prefix}embed_tokens.weight")
    shape, _, file = embed
    if shape != (config.vocab_size, config.hidden_size):
        raise ValueError(
            f"config.json says vocab_size={config.vocab_size}, hidden_size={config.hidden_size}, but "
            f"{prefix}embed_tokens.weight in {file!r} has shape {list(shape)}"
        )
    layers = _layer_count(shapes, prefix)
    if config.num_hidden_layers != layers:
        raise ValueError(
            f"config.json says num_hidden_layers={config.num_hidden_layers}, but {first_file!r} holds {layers} layers"
        )
    gate = shapes.get(prefix + "layers.0.mlp.gate_proj.weight")
    if gate is not None and tuple(gate[0]) != (config.intermediate_size, config.hidden_size):
        raise ValueError(
            f"config.json says intermediate_size={config.intermediate_size}, but {prefix}layers.0.mlp.gate_proj.weight "
            f"in {gate[2]!r} has shape {list(gate[0])}"
        )


def expected_state_shapes(model_class, config) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of ``model_class(config)``'s state dict, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = model_class(config)
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def shape_problems(expected: dict[str, tuple[int, ...]], stored: dict, allowed_missing=()) -> list[str]:
    """Differences between the model's tensors and the checkpoint's: missing, unexpected, reshaped."""
    problems = []
    missing = sorted(set(expected) - set(stored) - set(allowed_missing))
    unexpected = sorted(set(stored) - set(expected))
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing)}")
    if unexpected:
        problems.append(f"in the checkpoint but not in the model: {', '.join(unexpected)}")
    for name in sorted(set(expected) & set(stored)):
        if tuple(stored[name][0]) != tuple(expected[name]):
            problems.append(
                f"{name} has shape {tuple(stored[name][0])} in the checkpoint but {tuple(expected[name])} in the model"
            )
    return problems


# =============================================================================================
# The loaded state: complete, well-typed, finite
# =============================================================================================


def _dtype_problems(shapes: dict, model: nn.Module, name_file: bool = True) -> list[str]:
    """Integer or boolean checkpoint tensors for floating-point parameters (their bits would be cast to
    nonsense values). ``shapes`` is `header_shapes` of the weight files; ``name_file`` adds each file."""
    floating = {name for name, tensor in model.state_dict().items() if tensor.dtype.is_floating_point}
    return [
        f"{key} is stored as {dtype}{f' in {file!r}' if name_file else ''}, but the model's tensor is floating-point"
        for key, (_, dtype, file) in shapes.items()
        if key in floating and not dtype.startswith(("F", "BF"))
    ]


def value_problem(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> str | None:
    """What keeps ``tensor``, read from a file, from becoming a floating-point tensor of ``dtype`` with the same
    values (None: nothing). The one value check of every loader (`from_pretrained` applies it to the loaded
    model, the other loaders to each tensor before it is copied anywhere):

    - floating point: an integer or boolean tensor where a float belongs is refused, never cast;
    - finite *in* ``dtype``: NaN and ±inf are refused, and so is a value beyond ``dtype``'s range, which is
      finite in the file (a float64 1e300) but becomes ±inf once cast (a float32 parameter).

    Values too small for ``dtype`` round towards zero, as any narrowing cast rounds; they are not refused.
    """
    if not tensor.dtype.is_floating_point:
        return f"{name} is stored as {tensor.dtype}, not a floating-point tensor"
    if tensor.device.type == "meta":
        return None
    if not bool(torch.isfinite(tensor).all()):
        return f"{name} holds NaN or ±inf values"
    if not dtype.is_floating_point:
        raise TypeError(f"value_problem: {name} is checked against {dtype}, which is not a floating-point dtype")
    if torch.finfo(tensor.dtype).max > torch.finfo(dtype).max:
        largest = float(tensor.detach().abs().max()) if tensor.numel() else 0.0
        if largest > torch.finfo(dtype).max:
            return (
                f"{name} holds {largest:.3g}, beyond the range of {str(dtype).replace('torch.', '')} "
                f"(largest {torch.finfo(dtype).max:.3g}): it would become ±inf"
            )
    return None


def state_problems(shapes: dict, model: nn.Module) -> list[str]:
    """Problems of a loaded ``model`` against its weight files' headers ``shapes``: wrong dtypes
    (`_dtype_problems`) and values that are not finite in the model (`value_problem`)."""
    return _dtype_problems(shapes, model) + [
        problem
        for name, tensor in model.state_dict().items()
        if tensor.dtype.is_floating_point
        if (problem := value_problem(name, tensor, tensor.dtype)) is not None
    ]


def load_weights_strictly(model: nn.Module, file: str) -> None:
    """Load ``file`` into ``model`` in place, as strictly as ``from_pretrained``: every tensor present,
    with its shape, a floating dtype where the model's is floating, finite -- all checked before the
    model is touched. ``OSError`` naming ``file``."""
    stored = header_shapes([file])
    own = model.state_dict()
    expected = {name: tuple(tensor.shape) for name, tensor in own.items()}
    problems = shape_problems(expected, stored) or _dtype_problems(stored, model, name_file=False)  # named below
    if not problems:
        state = load_file(file)
        problems = [
            problem
            for name, tensor in state.items()
            if own[name].dtype.is_floating_point
            if (problem := value_problem(name, tensor, own[name].dtype)) is not None
        ]
    if problems:
        raise OSError(f"the weights {file!r} do not fit the model: " + "; ".join(problems))
    model.load_state_dict(state, strict=True)


def fsync_tree(directory: str) -> None:
    """fsync every file under ``directory`` and the directories themselves, so a rename after it publishes
    data that is on disk."""
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(root)


def fsync_directory(directory: str) -> None:
    """fsync a directory's entry list (after a rename into it)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory (Windows)
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
