"""torchrun with 2 processes (DDP: gloo on CPUs, NCCL on 2 CUDA devices) ends with the parameters of 1 process on
the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from wall_clock import budget

from causalqwen.app.tiny import save_tiny_base
from causalqwen.files.data import synthetic_texts

BACKENDS = [
    pytest.param("gloo", id="gloo"),
    pytest.param(
        "nccl",
        id="nccl",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs 2 CUDA devices, one per process"),
        ],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_process_ddp_equals_one_process(tmp_path, backend):
    base = save_tiny_base(tmp_path / "qwen")
    data = tmp_path / "train.jsonl"
    # sentences of different lengths and different numbers of <NUM>: the shards differ in padding and in
    # counts, which only a loss normalised over the global batch gets right
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in synthetic_texts(48, seed=4)))
    common = [
        "train",
        "--base",
        base,
        "--data",
        str(data),
        "--steps",
        "3",
        "--preset",
        "all",
        "--learning-rate",
        "1e-3",
        "--warmup-steps",
        "0",
        "--save-every",
        "3",
        "--log-every",
        "1",
        "--seed",
        "0",
    ]
    # the CLI takes NCCL and one CUDA device per process where CUDA is present, gloo and the CPU where it is not
    env = os.environ | {"OMP_NUM_THREADS": "1"} | ({"CUDA_VISIBLE_DEVICES": ""} if backend == "gloo" else {})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "causalqwen.app.cli",
            *common,
            "--out",
            str(tmp_path / "ddp"),
            "--batch-size",
            "4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=budget(300),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    single_run = subprocess.run(
        [sys.executable, "-m", "causalqwen.app.cli", *common, "--out", str(tmp_path / "single"), "--batch-size", "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=budget(300),
    )
    assert single_run.returncode == 0, single_run.stderr[-3000:]

    ddp = load_file(tmp_path / "ddp" / "model" / "model.safetensors")
    single = load_file(tmp_path / "single" / "model" / "model.safetensors")
    initial = load_file(tmp_path / "ddp" / "checkpoint-3" / "model.safetensors")
    assert ddp.keys() == single.keys()
    worst = max((ddp[k] - single[k]).abs().max().item() for k in ddp)
    print(f"largest |DDP - single| over all parameters after 3 steps: {worst:.3g}")
    assert worst <= 1e-5, worst
    assert any(not torch.equal(ddp[k], load_file(os.path.join(base, "model.safetensors")).get(k, ddp[k])) for k in ddp)
    assert all(torch.equal(ddp[k], initial[k]) for k in ddp)  # the final checkpoint is the final model
    steps = [json.loads(line)["step"] for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # rank 0 alone writes the log
