"""The adapters boundary: a saved LoRA adapter (``adapter_config.json``, ``adapter_model.safetensors``) loaded back.

An adapter tensor float32 cannot hold, and adapter settings that ``add_lora`` refuses: a NaN or negative
``lora_alpha``, an initialisation peft would run instead of loading.
"""

from __future__ import annotations

import math
import os

import torch

from ..cases import TrustCase
from ..fixtures import edit_json, fresh_dir, fresh_tiny_model
from .planted import replace_tensor

__all__ = ["CASES"]


def _saved_lora() -> str:
    from causalqwen.integrations.lora import add_lora, save_lora

    path = os.path.join(fresh_dir("lora"), "adapter")
    save_lora(add_lora(fresh_tiny_model(), rank=2), path)
    return path


def _float64_beyond_float32_lora():
    from safetensors.torch import load_file

    from causalqwen.integrations.lora import load_lora

    path = _saved_lora()
    file = os.path.join(path, "adapter_model.safetensors")
    name = sorted(load_file(file))[0]
    replace_tensor(file, name, torch.full_like(load_file(file)[name], 1e300, dtype=torch.float64))
    load_lora(fresh_tiny_model(), path)


def _lora_field(**fields):
    def trigger():
        from causalqwen.integrations.lora import load_lora

        path = _saved_lora()
        edit_json(os.path.join(path, "adapter_config.json"), lambda config: config.update(fields))
        load_lora(fresh_tiny_model(), path)

    return trigger


CASES = [
    # ---- silent
    TrustCase(
        "load-lora-float64-1e300",
        "silent",
        "load_lora of a float64 adapter tensor holding 1e300 (became inf)",
        _float64_beyond_float32_lora,
        ValueError,
        r"adapter_model\.safetensors'.*holds 1e\+300, beyond the range of float32",
    ),
    TrustCase(
        "load-lora-alpha-nan",
        "silent",
        "load_lora of an adapter_config.json with lora_alpha NaN (every output NaN)",
        _lora_field(lora_alpha=math.nan),
        ValueError,
        r"adapter_config\.json': field lora_alpha must be finite, got nan",
    ),
    TrustCase(
        "load-lora-alpha-negative",
        "silent",
        "load_lora with lora_alpha -16 (the update reversed)",
        _lora_field(lora_alpha=-16),
        ValueError,
        r"field lora_alpha must be > 0, got -16",
    ),
    TrustCase(
        "load-lora-init-pissa",
        "silent",
        'load_lora with init_lora_weights "pissa" (a raw peft error, no file)',
        _lora_field(init_lora_weights="pissa"),
        ValueError,
        r"adapter_config\.json'.*init_lora_weights must be true or false, got 'pissa'",
    ),
]
