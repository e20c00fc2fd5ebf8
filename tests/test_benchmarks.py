"""The benchmarks run (on the tiny shape, one repeat): a smoke test, with no timing asserted."""

from benchmarks import __main__ as benchmarks_main
from benchmarks import generation
from causalqwen.inference import MODES


def test_generation_benchmark_reports_every_mode_and_both_contexts(tmp_path):
    out = tmp_path / "generation.md"
    assert generation.main(["--shape", "tiny", "--repeats", "1", "--new-tokens", "2", "--long", "40", "--out", str(out)]) == 0
    report = out.read_text()
    for mode in MODES:
        assert f"| causalqwen {mode} |" in report
    assert "| Qwen2ForCausalLM.generate | " in report and "ms / token at context 40" in report


def test_benchmark_runner_rejects_an_unknown_name(capsys):
    assert benchmarks_main.main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err
