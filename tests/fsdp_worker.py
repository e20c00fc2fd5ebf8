"""One process of the 2-process FSDP test (`tests/test_fsdp.py`); not a test module itself.

Started twice by the test with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, as torchrun
would. Each process builds the same tiny CausalQwen, shards it with torch's FSDP2 ``fully_shard`` (each Qwen2
decoder layer, then the root) over a CPU device mesh with the gloo backend, and trains ``STEPS`` AdamW steps on
its half of every global batch with the loss normalised over the global batch (`globally_normalized_loss`).
Rank 0 writes the full parameters to ``OUT/fsdp.safetensors`` and the losses and shard sizes to
``OUT/fsdp.json``; every rank writes its own shard sizes to ``OUT/rank{RANK}.json``.

`run_training` with ``world=1`` and no process group is the oracle: one process, the whole global batch.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch

from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.training import globally_normalized_loss, parameter_groups, set_trainable

STEPS = 3
GLOBAL_BATCH = 8
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0


def global_batches(tokenizer) -> list[list[dict]]:
    """``STEPS`` global batches of ``GLOBAL_BATCH`` texts; sentences of different templates, so the two halves of
    a batch differ in length, padding and number of ``<NUM>`` targets."""
    data = TextDataset(synthetic_texts(STEPS * GLOBAL_BATCH, seed=4), tokenizer, max_length=32)
    return [data.items[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH] for step in range(STEPS)]


def run_training(model, tokenizer, rank: int, world: int) -> list[float]:
    """Train ``model`` in place for ``STEPS`` steps on this rank's share of each global batch; return the loss of
    the global batch at each step (the same on every rank)."""
    set_trainable(model, "all")
    model.train()
    optimizer = torch.optim.AdamW(parameter_groups(model, WEIGHT_DECAY), lr=LEARNING_RATE)
    losses = []
    for items in global_batches(tokenizer):
        share = len(items) // world
        batch = collate(items[rank * share : (rank + 1) * share], tokenizer.pad_token_id)
        out = model(**batch)
        if world > 1:
            loss = globally_normalized_loss(out, model.config)
            global_loss = loss.detach().clone()
            torch.distributed.all_reduce(global_loss)  # sum over ranks of W * share = W * global loss
            losses.append(global_loss.item() / world)
        else:
            loss = out.loss
            losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses


def main(out_dir: str) -> None:
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    # FSDP2 warns that the root returns views (the output's tensors); nothing here modifies them in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:  # each Qwen2DecoderLayer is one unit: gathered for its forward, then freed
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the rest: embeddings, norm, numerical embedding, abduction, head

    def local_numel() -> int:  # the elements of the parameters this process holds between steps
        return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())

    shard_sizes = {
        "rank": rank,
        "full_numel": sum(p.numel() for p in model.parameters()),
        "all_dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
        "local_numel": local_numel(),
    }
    losses = run_training(model, tokenizer, rank, world)
    shard_sizes["local_numel_after_training"] = local_numel()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        handle.write(json.dumps(shard_sizes) + "\n")

    # a collective: every rank takes part, rank 0 alone receives the full tensors (cpu_offload)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        save_file(
            {name: tensor.contiguous() for name, tensor in state.items()}, os.path.join(out_dir, "fsdp.safetensors")
        )
        with open(os.path.join(out_dir, "fsdp.json"), "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"losses": losses, "world": world}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
