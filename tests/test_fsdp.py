"""Sharded training (torch FSDP2 ``fully_shard``) on 2 CPU processes (gloo) equals 1 process on the whole batch.

What is specified: two processes, each holding only its shard of every parameter (each Qwen2 decoder layer and
then the root wrapped with ``fully_shard`` over a CPU device mesh), train 3 AdamW steps (gradient norm clipped at
1.0), each on its half of every global batch of 8 texts, with the loss normalised over the global batch
(`causalqwen.training.globally_normalized_loss`). The full parameters they end with, gathered on rank 0, and the
global-batch loss at every step equal those of the oracle -- one process, no sharding, training the same model on
the whole global batch with ``model(**batch).loss`` -- within float tolerance. During training each rank holds
about half of the parameters' elements, before the first step and after the last, and the two shards
together hold all of them.

The processes run `tests/fsdp_worker.py` (rank 0 writes safetensors and JSON, no pickle); the oracle is the same
`run_training` called here with ``world=1``.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from fsdp_worker import run_training
from safetensors.torch import load_file
from wall_clock import budget

from causalqwen.app.tiny import build_tiny_causal_lm

WORKER = Path(__file__).with_name("fsdp_worker.py")
WORLD = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_processes(out_dir: Path) -> None:
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(WORLD),
    }
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(out_dir)],
            env=env | {"RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    try:
        outputs = [process.communicate(timeout=budget(120))[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for rank, (process, output) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, f"rank {rank} exited with {process.returncode}:\n{output[-3000:]}"


def test_two_process_fully_shard_equals_one_process(tmp_path):
    run_two_processes(tmp_path)

    # the sharding is real: each rank holds about half of every parameter's elements, the two halves all of them
    shards = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    full = shards[0]["full_numel"]
    assert all(shard["all_dtensor"] and shard["full_numel"] == full for shard in shards)
    assert sum(shard["local_numel"] for shard in shards) == full
    for shard in shards:
        assert abs(shard["local_numel"] / full - 1 / WORLD) < 0.01, shard
        assert shard["local_numel_after_training"] == shard["local_numel"], shard  # still sharded after the steps

    torch.manual_seed(0)
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    single_losses = run_training(model, tokenizer, rank=0, world=1)
    single = model.state_dict()

    sharded = load_file(tmp_path / "fsdp.safetensors")
    sharded_losses = json.loads((tmp_path / "fsdp.json").read_text())["losses"]
    assert sharded.keys() == single.keys()
    worst = max((sharded[name] - single[name]).abs().max().item() for name in single)
    print(f"largest |FSDP (2 processes) - 1 process| over all parameters after 3 steps: {worst:.3g}")
    for name in single:
        torch.testing.assert_close(sharded[name], single[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(torch.tensor(sharded_losses), torch.tensor(single_losses), rtol=1e-5, atol=0.0)
    # every parameter, the sharded backbone included, was trained
    assert all(not torch.equal(single[name], initial[name]) for name in single)
