r"""bfloat16 training with float32 master weights, and the autocast the training loop runs its forward pass in.

A bfloat16 weight $w$ moves only when an update exceeds half its spacing, $2^{\lfloor \log_2 |w| \rfloor - 8}$;
`float32_master_weights` keeps the trained parameters in float32 for the run, so every update accumulates as in a
float32 run, and `check_trainable_dtypes` refuses float16, whose gradients would need loss scaling.
"""

from __future__ import annotations

import contextlib
import logging

import torch

__all__ = ["check_trainable_dtypes", "float32_master_weights", "autocast_in"]

logger = logging.getLogger("causalqwen.training")  # the training loop's own log, where its other messages go


def check_trainable_dtypes(model) -> None:
    """A ``ValueError`` naming the float16 parameters of ``model``, if it has any: float16 gradients need loss
    scaling, which `train` does not do. bfloat16 trains (`float32_master_weights`); float32 and wider as they are."""
    half = [name for name, parameter in model.named_parameters() if parameter.dtype == torch.float16]
    if half:
        shown = ", ".join(half[:3]) + (f" and {len(half) - 3} more" if len(half) > 3 else "")
        raise ValueError(
            f"the model holds float16 parameters ({shown}), which train does not update: float16 gradients "
            "need loss scaling; train in float32 (model.float(), or --dtype float32 on the command line) or "
            "bfloat16 (model.to(torch.bfloat16), or --dtype bfloat16)"
        )


@contextlib.contextmanager
def float32_master_weights(model):
    r"""Train a bfloat16 model with float32 master weights: inside the block its trainable bfloat16 parameters
    are float32 (cast in place, the same ``Parameter`` objects), and the block yields the dtype the forward pass
    runs in under ``torch.autocast`` (bfloat16), or None when no parameter is bfloat16 (nothing changes).

    An AdamW update is about the learning rate; bfloat16 keeps 8 significant bits, so a weight $w$ moves only
    when the update exceeds half its spacing, $2^{\lfloor \log_2 |w| \rfloor - 8}$: at ``lr = 1e-4`` a weight
    of 1 (the diagonal of $W_{\mathrm{loc}}$), $-2.25$ ($b_{\mathrm{scale}}$) or 0.1 ($b_{\mathrm{noise}}$) never
    moves in bfloat16, where in float32 each update accumulates. The frozen parameters stay bfloat16 (the
    forward runs in bfloat16 under autocast, in the memory of a bfloat16 model). When the block ends the
    parameters it cast go back to bfloat16, rounded once: the model keeps its dtype (``model.float()`` before
    training keeps the trained float32 values). A parameter that moved in float32 but rounds back to its starting
    bfloat16 value everywhere has had all its training erased by that rounding: a warning names each one."""
    floating = [(name, parameter) for name, parameter in model.named_parameters() if parameter.is_floating_point()]
    if not any(parameter.dtype == torch.bfloat16 for _, parameter in floating):
        yield None
        return
    cast = [
        (name, parameter)
        for name, parameter in floating
        if parameter.requires_grad and parameter.dtype == torch.bfloat16
    ]
    logger.warning(
        "training the %d trainable bfloat16 parameters (%s) in float32 (master weights; the forward "
        "pass runs under bfloat16 autocast); they are rounded back to bfloat16 when training ends "
        "(model.float() before training keeps float32)",
        len(cast),
        ", ".join(name for name, _ in cast[:3]) + (", ..." if len(cast) > 3 else ""),
    )
    start = [parameter.detach().clone() for _, parameter in cast]  # bfloat16: what the rounding may fall back to
    for _, parameter in cast:
        parameter.data = parameter.data.float()
    try:
        yield torch.bfloat16
    finally:
        erased = []
        for (name, parameter), before in zip(cast, start):
            moved = not torch.equal(parameter.data, before.float())
            parameter.data = parameter.data.to(torch.bfloat16)
            if moved and torch.equal(parameter.data, before):
                erased.append(name)
        if erased:
            logger.warning(
                "rounding back to bfloat16 erased all the training of %d parameters (%s): each moved in "
                "float32 by less than half a bfloat16 spacing and is back at its start; train in float32 "
                "to keep them (--dtype float32, or model.float() before training)",
                len(erased),
                ", ".join(erased[:5]) + (f" and {len(erased) - 5} more" if len(erased) > 5 else ""),
            )


def autocast_in(dtype: torch.dtype | None, device: torch.device):
    """``torch.autocast`` in ``dtype`` on ``device``'s kind, or no change when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
