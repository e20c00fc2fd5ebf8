"""The package on a CUDA device: every public path runs there and agrees with the CPU.

Marked ``cuda``; skipped where no CUDA device is present (CI has none). Oracles: the same computation on the CPU
(float32, so the tolerances are those of different kernels, not of different formulas), and the literal tile.
"""

import warnings

import pytest
import torch

from causalqwen import train
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.generation import generate
from causalqwen.inference import MODES
from causalqwen.kernels import tiles
from causalqwen.training import TrainingConfig

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _pair(**overrides):
    cpu, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0, **overrides)
    gpu, _, _ = build_tiny_causal_lm(seed=0, init_seed=0, **overrides)
    return cpu.eval(), gpu.cuda().eval(), tokenizer


def _batch(tokenizer, n=6):
    return collate(TextDataset(synthetic_texts(n, seed=2), tokenizer, max_length=40).items, tokenizer.pad_token_id)


@pytest.mark.parametrize("loss_algorithm", ["fused", "literal"])
def test_forward_and_both_losses_agree_with_the_cpu(loss_algorithm):
    cpu, gpu, tokenizer = _pair(loss_algorithm=loss_algorithm, gate_alpha=1.0)
    batch = _batch(tokenizer)
    out_cpu = cpu(**batch)
    out_gpu = gpu(**{k: v.cuda() for k, v in batch.items()})
    torch.testing.assert_close(out_gpu.loss.cpu(), out_cpu.loss, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_gpu.loc_U.cpu(), out_cpu.loc_U, rtol=1e-4, atol=1e-4)
    out_cpu.loss.backward()
    out_gpu.loss.backward()
    torch.testing.assert_close(gpu.abduction.W_loc.grad.cpu(), cpu.abduction.W_loc.grad, rtol=1e-3, atol=1e-4)


def test_the_compiled_tile_on_cuda_equals_the_literal_tile():
    generator = torch.Generator(device="cuda").manual_seed(0)
    diff = torch.randn(128, 1024, device="cuda", generator=generator) * 60
    scale_raw = torch.rand(128, 1024, device="cuda", generator=generator) * 30
    got = tiles.tile_elementwise_compiled(diff, scale_raw, 1e-6, True, True)
    want = tiles.tile_elementwise(diff, scale_raw, 1e-6, True, True)
    assert tiles.tile_elementwise_compiled.failure is None
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_generates_on_cuda(mode):
    cpu, gpu, tokenizer = _pair()
    encoding = tokenizer(["The price is 12.5 yuan and", "A cup of tea costs"], padding_side="left")
    generator = torch.Generator(device="cuda").manual_seed(0)
    out = generate(
        gpu,
        encoding["input_ids"].cuda(),
        encoding["numeric_values"].cuda(),
        encoding["attention_mask"].cuda(),
        mode=mode,
        max_new_tokens=5,
        generator=generator,
    )
    assert out.sequences.device.type == "cuda" and out.sequences.shape[1] == encoding["input_ids"].shape[1] + 5
    if mode == "standard":  # no draw: the same tokens as on the CPU
        expected = generate(
            cpu,
            encoding["input_ids"],
            encoding["numeric_values"],
            encoding["attention_mask"],
            mode=mode,
            max_new_tokens=5,
        )
        assert torch.equal(out.sequences.cpu(), expected.sequences)


def test_training_runs_on_cuda():
    _, gpu, tokenizer = _pair(gate_alpha=1.0, regression_weight=0.1)
    data = TextDataset(synthetic_texts(64, seed=0), tokenizer, max_length=40)
    history = train(
        gpu, data, TrainingConfig(steps=10, batch_size=8, preset="all", log_every=5, learning_rate=1e-2), progress=False
    )
    assert history[-1]["train/total_loss"] < history[0]["train/total_loss"]
    assert all(p.device.type == "cuda" for p in gpu.parameters())


def test_the_host_sync_counter_sees_every_synchronisation_cuda_reports():
    """`benchmarks.syncs.HostSyncCounter` (which CI runs on the CPU) misses none of the synchronisations that CUDA's
    own sync debug mode reports, for a training forward and for generation."""
    from benchmarks import syncs

    _, gpu, tokenizer = _pair()
    batch = {k: v.cuda() for k, v in _batch(tokenizer).items()}
    encoding = tokenizer(["The price is 12.5 yuan and", "A cup of tea costs"], padding_side="left")
    prompt = [encoding[k].cuda() for k in ("input_ids", "numeric_values", "attention_mask")]
    jobs = {"forward": lambda: gpu(**batch), "generate": lambda: generate(gpu, *prompt, max_new_tokens=4)}
    for name, job in jobs.items():
        job()  # warm-up: compiling and caching are not what is counted
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                counted = syncs.count(job)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        reported = [w for w in caught if "synchroniz" in str(w.message)]
        assert len(reported) <= counted.total, (name, counted.counts, [str(w.message) for w in reported])
