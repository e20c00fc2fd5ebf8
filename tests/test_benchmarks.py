"""The benchmarks run (on the tiny shape, one repeat): a smoke test, with no timing asserted."""

from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as benchmarks_main
from benchmarks import generation, head, syncs, training_step
from benchmarks.common import peak_extra_memory
from causalqwen.inference import MODES


def test_generation_benchmark_reports_every_mode_and_both_contexts(tmp_path, capsys):
    out = tmp_path / "generation.md"
    status = generation.main(
        ["--shape", "tiny", "--repeats", "1", "--new-tokens", "2", "--long", "40", "--out", str(out)]
    )
    report = out.read_text()
    # the exit status says whether every goal row was met (timings of one tiny repeat are noise)
    assert status == (0 if "| NO |" not in report else 1)
    assert ("SOME GOALS NOT MET" in capsys.readouterr().out) == (status == 1)
    for mode in MODES:
        assert f"| causalqwen {mode} |" in report
    assert "| Qwen2ForCausalLM.generate | " in report and "ms / token at context 40" in report


def test_benchmark_runner_rejects_an_unknown_name(capsys):
    assert benchmarks_main.main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


def test_head_benchmark_reports_every_variant_and_the_flatness_table():
    report, _ = head.run(ns=(8, 16), hidden=8, vocab=300, repeats=1, own_process=False)
    for n in (8, 16):
        for variant in head.VARIANTS:
            assert f"| {n} | {variant} |" in report
    assert "Extra memory against N (N = 16 vs 8)" in report and "| fused_sum |" in report


def test_head_benchmark_variants_compute_the_same_gradient():
    """The timed variants are the same computation: their gradients of W agree."""
    inputs = head.make_inputs(6, 8, 50)
    grads = {}
    for name in ("literal", "fused", "fused_sum"):
        head.variant_run(name, inputs)()
        grads[name] = inputs["action"].classification_head.weight.grad.clone()
    torch.testing.assert_close(grads["fused"], grads["literal"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grads["fused_sum"], grads["literal"], rtol=1e-4, atol=1e-6)


def test_peak_extra_memory_sees_a_large_allocation():
    held = []
    extra = peak_extra_memory(lambda: held.append(torch.ones(64 * 2**20 // 4)))  # 64 MiB, touched
    assert 60 * 2**20 <= extra <= 200 * 2**20


def test_training_step_benchmark_runs_both_models_on_the_tiny_shape():
    report, _ = training_step.run(training_step.Setting(shape="tiny", tokens=32), steps=1, rounds=1, own_process=False)
    assert "| Qwen2ForCausalLM |" in report and "| CausalQwenForCausalLM |" in report
    assert "peak vs allowance" in report and "1 x 32 tokens" in report and "CPU" in report


def test_training_step_benchmark_in_bfloat16_autocast_with_a_batch_in_its_own_processes(capsys):
    """The GPU setting's code path (autocast, several rows, the child processes) on the CPU; Liger asked for
    where it is not installed is said so, not an error."""
    status = training_step.main(
        [
            "--shape",
            "tiny",
            "--tokens",
            "16",
            "--batch",
            "3",
            "--dtype",
            "bfloat16",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--liger",
        ]
    )
    report = capsys.readouterr().out
    assert status in (0, 1) and "3 x 16 tokens" in report and "bfloat16 autocast" in report
    assert "| CausalQwenForCausalLM |" in report
    if not training_step.liger_available():
        assert "`liger-kernel` is not installed" in report


def test_training_step_benchmark_refuses_a_device_that_is_not_there(capsys):
    bad = ["--device", "tpu"] if torch.cuda.is_available() else ["--device", "cuda"]
    with pytest.raises(SystemExit) as exit_info:
        training_step.main(["--shape", "tiny", *bad])
    assert exit_info.value.code == 2 and "--device" in capsys.readouterr().err


def test_tokenizer_benchmark_reports_every_call_shape(tmp_path):
    from benchmarks import tokenizer

    out = tmp_path / "tokenizer.md"
    status = tokenizer.main(["--vocab", "tiny", "--megabytes", "0.05", "--repeats", "1", "--out", str(out)])
    report = out.read_text()
    assert status == (0 if "| NO |" not in report else 1)
    for call in ("batch", "single", "whole", "large batch"):
        assert f"| {call} |" in report
    for corpus in ("mixed", "dense", "varied"):
        assert f"| large batch | {corpus} |" in report
    assert "numbers per line" in report and "documents)" in report and "load average" in report


def test_the_tokenizer_benchmarks_documents_and_varied_corpus_hold_what_they_say():
    """A large batch's documents are the corpus's lines, joined; the varied corpus's text between numbers does not
    repeat (so no run is encoded once for many), unlike the dense corpus's."""
    from benchmarks.tokenizer import dense_lines, documents, varied_lines
    from causalqwen.numbers import find_numbers, split_texts

    lines = varied_lines(0.05)
    joined = documents(lines)
    assert "\n".join(joined) == "\n".join(lines)
    assert all(len(document) >= 240 for document in joined[:-1])
    repeated = {}
    for name, corpus in (("varied", lines), ("dense", dense_lines(0.05))):
        runs = [run for pieces in split_texts(corpus) for run in pieces.runs[1:-1]]  # between two numbers
        repeated[name] = 1 - len(set(runs)) / len(runs)
        assert 4 <= sum(len(find_numbers(line)) for line in corpus) / len(corpus) <= 12
    assert repeated["varied"] < 0.05 and repeated["dense"] > 0.5, repeated


def test_the_benchmark_times_every_crafted_text():
    from benchmarks.tokenizer import ADVERSARIAL, adversarial

    report, met = adversarial(sizes=(1_000, 2_000), repeats=1)
    assert met  # no 1 MB size: nothing is judged
    for name in ADVERSARIAL:
        assert f"| {name} | " in report
    assert "time 2 kB / 1 kB" in report and "plain tokenizer, 2 kB (s)" in report


def test_divergence_bound_benchmark_reports_every_preset():
    from benchmarks import divergence_bound

    report = divergence_bound.run(shape="tiny", tokens=16, repeats=1)
    for preset in divergence_bound.PRESETS:
        assert f"| {preset} | " in report
    assert "s / step with the bound" in report


def test_contention_benchmark_times_the_demo_beside_a_busy_loop():
    from benchmarks import contention

    seconds = contention.child("demo", threads=1, busy=1)
    assert seconds > 0


def test_demo_runs_with_its_thread_count_and_restores_the_callers(tmp_path, monkeypatch):
    import torch

    from causalqwen.app import demo

    seen = []
    monkeypatch.setattr(demo, "_run_demo", lambda *args: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    assert demo.run_demo(str(tmp_path / "d"), steps=1) == 0
    assert seen == [demo.DEMO_THREADS] and torch.get_num_threads() == before


def test_the_host_sync_counter_counts_device_reads_and_data_dependent_shapes():
    """Each construct known to make the host wait for a device counts once; device-side work counts nothing."""
    x = torch.arange(6.0) - 2
    mask = x > 0
    reads = {
        "x[mask] = 0": lambda: x.clone().__setitem__(mask, 0.0),
        "bool": lambda: bool(mask.any()),
        "item": lambda: x.sum().item(),
        "int": lambda: int(x.argmax()),
        "tolist": lambda: x.tolist(),
        "nonzero": lambda: mask.nonzero(),
        "boolean indexing": lambda: x[mask],
        "masked_select": lambda: x.masked_select(mask),
        "unique": lambda: torch.unique(x),
    }
    for name, read in reads.items():
        assert syncs.count(read).total == 1, name
    on_device = syncs.count(lambda: (x.exp() * mask).cumsum(0).where(mask, 0.0).topk(2).values.softmax(0))
    assert on_device.total == 0, on_device.counts
    counted = syncs.count(lambda: [bool(mask.any()) for _ in range(3)])
    assert counted.total == 3 and sum(counted.sites.values()) == 3
    (site,) = counted.sites
    assert site.startswith("tests/test_benchmarks.py:"), site


def test_host_syncs_stay_at_the_checks_and_the_stop_test():
    """CausalQwen's own synchronisations: the input check of a forward (and with labels the scored-row selection of
    the fused loss), the stop test of a generation step; none in backward (there were 17-18 and 12-14)."""
    jobs = {job.name: job for job in syncs.measure()}
    assert jobs["its backward"].ours == 0
    assert jobs["training forward (labels)"].ours - jobs["training forward (labels)"].qwen <= 2
    for name, job in jobs.items():
        if name != "training forward (labels)":
            assert job.ours - job.qwen <= 1, (name, job)
            assert sum(job.own_sites.values()) <= 1, (name, job.own_sites)
        if "per token" in name:  # no more than Qwen2's generate, 1 per token (the stop test)
            assert job.ours <= job.qwen and job.ours == 1, (name, job)
    assert len(jobs) == 3 + 2 * len(MODES)


def test_sync_sites_are_named_from_the_repository_root_whatever_its_folders_are_called():
    """A clone in a folder called ``causalqwen`` (with the package folder of the same name inside) names this file
    ``tests/test_benchmarks.py``; a file outside the repository keeps its last two parts."""
    here = Path(__file__).resolve()
    assert syncs._short_path(str(here)) == "tests/test_benchmarks.py"
    assert (
        syncs._short_path(str(here.parent.parent / "causalqwen" / "kernels" / "fused.py"))
        == "causalqwen/kernels/fused.py"
    )
    assert syncs._short_path("/home/someone/causalqwen/causalqwen/tests/elsewhere.py") == "tests/elsewhere.py"
