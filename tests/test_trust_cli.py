"""Trust boundaries of the command line: every option and every file the ``causalqwen`` command
reads fails with exit status 2 and one line naming the option, or the file and line, that is wrong; a
Ctrl-C during ``train`` names the last checkpoint and the command that continues the run (exit 130)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from wall_clock import budget

from causalqwen import NumericTokenizer
from causalqwen.app import cli, commands, runs, training_run
from causalqwen.files.data import read_jsonl
from causalqwen.files.rundir import RunDirectory

BIG = "99999999999999999999999"  # beyond 64 bits: "Overflow when unpacking long long" before the fix
HUGE = "9" * 5000  # beyond Python's 4300-digit limit on int(str)


def _fails(capsys, args):
    """Run ``causalqwen ARGS``; assert exit status 2 and one error line without a traceback; return that line."""
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2, err
    assert err and not any("Traceback" in line for line in err), err
    return err[-1]


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


@pytest.fixture
def data(tmp_path):
    return _jsonl(tmp_path / "train.jsonl", ["a 1", "b 2", "c 3", "d 4"])


# ---------------------------------------------------------------------------------------------
# 1. Integer options: the accepted range, named with the option
# ---------------------------------------------------------------------------------------------


SEED_RANGE = "must be an integer from 0 to 4294967295"
WIDTH = "must be an integer no larger than 9223372036854775807"


@pytest.mark.parametrize(
    "command",
    [
        ["walkthrough"],
        ["generate", "--prompt", "x"],
        ["demo", "--out", "{tmp}/d"],
        ["train", "--base", "tiny", "--data", "{data}", "--out", "{tmp}/r"],
    ],
)
@pytest.mark.parametrize("value", [BIG, "-1", str(2**32), str(2**64), HUGE])
def test_every_seed_option_names_its_range(command, value, tmp_path, data, capsys):
    args = [a.format(tmp=tmp_path, data=data) for a in command] + ["--seed", value]
    line = _fails(capsys, args)
    shown = value if len(value) < 40 else f"{value[:12]}... ({len(value)} digits)"
    assert line.endswith(f"argument --seed: {SEED_RANGE} (2**32 - 1), got {shown}"), line
    assert len(line) < 200
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == ["train.jsonl"]  # nothing written


@pytest.mark.parametrize(
    "option",
    [
        "--steps",
        "--batch-size",
        "--warmup-steps",
        "--max-length",
        "--eval-every",
        "--save-every",
        "--save-total-limit",
        "--log-every",
        "--lora-rank",
    ],
)
@pytest.mark.parametrize("value", [BIG, str(2**63), HUGE])
def test_every_train_count_option_is_bounded_by_64_bits(option, value, tmp_path, data, capsys):
    line = _fails(capsys, ["train", "--base", "tiny", "--data", data, "--out", str(tmp_path / "r"), option, value])
    expected = "must be an integer from 1 to 9223372036854775807" if option == "--lora-rank" else WIDTH
    assert f"argument {option}: {expected} (2**63 - 1), got " in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--steps", BIG], f"argument --steps: {WIDTH}"),
        (["generate", "--prompt", "x", "--max-new-tokens", BIG], f"argument --max-new-tokens: {WIDTH}"),
        (["generate", "--prompt", "x", "--mode", "traditional", "--top-k", str(2**64)], f"argument --top-k: {WIDTH}"),
        (["generate", "--prompt", "x", "--seed", "1.5"], "argument --seed: expected an integer, got '1.5'"),
        (
            ["generate", "--prompt", "x", "--max-new-tokens", "ten"],
            "argument --max-new-tokens: expected an integer, got 'ten'",
        ),
    ],
)
def test_other_integer_options_name_the_option(args, message, capsys):
    assert message in _fails(capsys, args)


@pytest.mark.parametrize(
    "option, value, message",
    [  # below range: the library's check names the setting
        ("--steps", "0", "steps must be a positive int, got 0"),
        ("--batch-size", "-1", "batch_size must be a positive int, got -1"),
        ("--warmup-steps", "-1", "warmup_steps must be an int >= 0, got -1"),
        ("--eval-every", "0", "eval_every must be a positive int, got 0"),
        ("--save-every", "-3", "save_every must be a positive int, got -3"),
        ("--log-every", "0", "log_every must be a positive int, got 0"),
        ("--save-total-limit", "-1", "save_total_limit must be an int >= 0, got -1"),
        ("--warmup-ratio", "1.5", "warmup_ratio must be a number from 0 to 1 or None, got 1.5"),
        ("--max-length", "1", "max_length must be an int >= 2, got 1"),
        ("--lora-rank", "0", "argument --lora-rank: must be an integer from 1 to 9223372036854775807"),
    ],
)
def test_negative_and_zero_counts_are_refused_by_name(option, value, message, qwen_dir, tmp_path, data, capsys):
    extra = ["--preset", "lora"] if option == "--lora-rank" else []
    line = _fails(
        capsys, ["train", "--base", qwen_dir, "--data", data, "--out", str(tmp_path / "r"), option, value, *extra]
    )
    assert message in line, line
    assert not (tmp_path / "r").exists()


def test_warmup_steps_and_warmup_ratio_together_are_refused_naming_both(tmp_path, data, capsys):
    line = _fails(
        capsys,
        [
            "train",
            "--base",
            "tiny",
            "--data",
            data,
            "--out",
            str(tmp_path / "r"),
            "--warmup-steps",
            "5",
            "--warmup-ratio",
            "0.2",
        ],
    )
    assert "argument --warmup-ratio: not allowed with argument --warmup-steps" in line, line
    assert not (tmp_path / "r").exists()


def test_a_lora_rank_beyond_the_hidden_size_is_refused_before_allocating(qwen_dir, tmp_path, data, capsys):
    started = time.perf_counter()
    line = _fails(
        capsys,
        [
            "train",
            "--base",
            qwen_dir,
            "--data",
            data,
            "--out",
            str(tmp_path / "r"),
            "--preset",
            "lora",
            "--lora-rank",
            str(2**40),
        ],
    )
    assert "--lora-rank 1099511627776 exceeds the base's hidden size 64" in line, line
    assert time.perf_counter() - started < budget(30) and not (tmp_path / "r").exists()


def test_seeds_at_the_ends_of_the_range_work(capsys):
    for seed in ("0", str(2**32 - 1)):
        assert cli.main(["generate", "--prompt", "It is 3 degrees", "--max-new-tokens", "2", "--seed", seed]) == 0
        assert capsys.readouterr().out.startswith("It is 3 degrees")


# ---------------------------------------------------------------------------------------------
# 2-4. JSONL files from elsewhere: line ends, nesting, huge integers, encodings, binary files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_every_line_ending_reads_the_same_lines(tmp_path, ending):
    path = tmp_path / "data.jsonl"
    path.write_bytes(ending.join(['{"text": "a 1"}', "", '{"text": "b 2"}', '{"text": "c\\r\\nd 3"}']).encode() + b"\r")
    texts, sources = read_jsonl(path)
    assert texts == ["a 1", "b 2", "c\r\nd 3"]
    assert sources == [f"{path}, line 1", f"{path}, line 3", f"{path}, line 4"]


def test_mixed_line_endings_count_lines_as_an_editor_does(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r{"text": "c"}\n\r\n{"text": 7}\r')
    with pytest.raises(ValueError, match=r"data\.jsonl, line 5: the field 'text' must be a string, got int"):
        read_jsonl(path)


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a 1"}\r\n{"text": "\xef\xbb\xbfb"}\r\n')
    assert read_jsonl(path)[0] == ["a 1", "\ufeffb"]  # only the file's first bytes are a mark; a text keeps its own


@pytest.mark.parametrize(
    "content, message",
    [
        (
            b'{"text": "ok"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n",
            r"bad\.jsonl, line 2: the JSON is nested too deeply to read",
        ),
        (
            b'{"text": "ok"}\n{"text": "x", "id": ' + HUGE.encode() + b"}\n",
            r"bad\.jsonl, line 2: an integer of 5000 digits, more than the 4300 Python converts",
        ),
        (
            b'{"text": "ok"}\n{"text": "x", "id": -' + HUGE.encode() + b"}\n",
            r"bad\.jsonl, line 2: an integer of 5000 digits",
        ),
        (
            '{"text": "a 1"}\n'.encode("utf-16"),
            (
                r"bad\.jsonl: the file is UTF-16 text \(it starts with the byte-order mark "
                r"b'\\xff\\xfe'\); JSONL must be UTF-8"
            ),
        ),
        ('{"text": "a 1"}\n'.encode("utf-16-be"), r"bad\.jsonl, line 1: a NUL byte at byte 0 of the line"),
        ('{"text": "a 1"}\n'.encode("utf-32"), r"bad\.jsonl: the file is UTF-32 text"),
        (bytes(range(256)) * 4, r"bad\.jsonl, line 1: a NUL byte at byte 0 of the line \(a binary file"),
        (b"\x89PNG\r\n\x1a\n", r"bad\.jsonl, line 1: invalid UTF-8 at byte 0 of the line"),
        (b'{"text": "a", "text": "b"}\n', r"bad\.jsonl, line 1: the key 'text' appears twice in one object"),
        (b'{"text": "ok"}\n\x0c\n', r"bad\.jsonl, line 2: not valid JSON \(Expecting value at column 1\)"),
        (b'{"text": "ok"} {"text": "two"}\n', r"bad\.jsonl, line 1: not valid JSON \(Extra data at column 16\)"),
        (b"", r"bad\.jsonl: the dataset is empty \(no line with a row\)"),
        (b"\r\r\n\n", r"bad\.jsonl: the dataset is empty"),
    ],
)
def test_bad_jsonl_files_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_jsonl(path)


def test_a_path_that_is_no_file_is_named(tmp_path):
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(OSError, match=r"cannot read the JSONL file '.*folder\.jsonl': it is a directory"):
        read_jsonl(tmp_path / "folder.jsonl")
    with pytest.raises(OSError, match=r"cannot read the JSONL file '.*missing\.jsonl': it does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_the_command_reads_the_data_before_loading_the_model(tmp_path, capsys, monkeypatch):
    """Bad data fails at once (exit 2, file and line), before a possibly large model is loaded."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": "ok"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes(b'{"text": "a 1"}\r{"text": "b 2"}\r{"oops": 1}\r')
    (tmp_path / "dir.jsonl").mkdir()
    loaded = []
    monkeypatch.setattr(commands, "load_model_and_tokenizer", lambda *a, **k: loaded.append(a))
    base = ["train", "--base", "tiny", "--out", str(tmp_path / "r")]
    assert "deep.jsonl, line 2: the JSON is nested too deeply to read" in _fails(capsys, base + ["--data", str(deep)])
    assert "cr.jsonl, line 3: expected a JSON object" in _fails(capsys, base + ["--data", str(cr)])
    assert "dir.jsonl': it is a directory" in _fails(capsys, base + ["--data", str(tmp_path / "dir.jsonl")])
    good = _jsonl(tmp_path / "good.jsonl", ["a 1"])
    line = _fails(capsys, base + ["--data", good, "--eval-data", str(deep)])
    assert "deep.jsonl, line 2: the JSON is nested too deeply to read" in line
    assert loaded == [] and not (tmp_path / "r").exists()


def test_a_cr_only_file_trains(qwen_dir, tmp_path, capsys):
    data = tmp_path / "mac.jsonl"
    data.write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\r" for t in ["a 1", "b 2", "c 3", "d 4"]))
    assert (
        cli.main(
            [
                "train",
                "--base",
                qwen_dir,
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--steps",
                "1",
                "--batch-size",
                "4",
            ]
        )
        == 0
    )
    assert (tmp_path / "r" / "model" / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# 5. Model directories: corrupt or missing files are named
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, reason",
    [
        (
            "tokenizer.json",
            b'{"version": "1.0", "model": {"type": "BPE", "vo',
            r"is not valid JSON \(Unterminated string starting at: line 1, column 45\)",
        ),
        ("tokenizer.json", b"\xff\xfe{}", r"is not UTF-8 text \(invalid byte 0xff at offset 0\)"),
        (
            "tokenizer_config.json",
            b"{",
            r"is not valid JSON \(Expecting property name enclosed in double quotes: line 1, column 2\)",
        ),
        ("config.json", b'{"a": 1}\n[[[', r"is not valid JSON \(Extra data: line 2, column 1\)"),
        ("tokenizer.json", b"[" * 100_000, r"cannot be read: the JSON is nested too deeply"),
    ],
)
def test_a_corrupt_json_file_of_a_model_directory_is_named(qwen_dir, tmp_path, capsys, name, content, reason):
    import re
    import shutil

    target = tmp_path / "model"
    shutil.copytree(qwen_dir, target)
    (target / name).write_bytes(content)
    pattern = re.escape(repr(str(target / name))) + " " + reason
    line = _fails(capsys, ["generate", "--model", str(target), "--prompt", "x"])
    assert re.search(pattern, line), line
    with pytest.raises(OSError, match=pattern):  # the library's doors name it too
        NumericTokenizer.from_pretrained(target)


def test_a_model_directory_without_a_tokenizer_is_named(qwen_dir, tmp_path, capsys):
    import shutil

    target = tmp_path / "model"
    shutil.copytree(qwen_dir, target)
    for name in os.listdir(target):
        if name.startswith("tokenizer"):
            os.remove(target / name)
    line = _fails(capsys, ["generate", "--model", str(target), "--prompt", "x"])
    assert (
        f"cannot load a tokenizer from {str(target)!r}: the directory holds no tokenizer file (tokenizer.json, "
        "vocab.json or tokenizer.model)"
    ) in line, line
    # the library's door says the same: transformers would build a tokenizer of one token from the config alone,
    # and from_qwen would have taken its length, 1, for the <NUM> id (an ordinary token of the base)
    from causalqwen import CausalQwenForCausalLM

    with pytest.raises(ValueError, match=r"holds no tokenizer file .*from_qwen reads the <NUM> id"):
        CausalQwenForCausalLM.from_qwen(target)


# ---------------------------------------------------------------------------------------------
# 6. Ctrl-C during train: the last checkpoint and the command that continues
# ---------------------------------------------------------------------------------------------


def _interrupt_after_checkpoint(monkeypatch, step):
    save = runs.save_checkpoint

    def save_then_interrupt(out_dir, state):
        path = save(out_dir, state)
        if state.step == step:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(runs, "save_checkpoint", save_then_interrupt)


def test_ctrl_c_names_the_last_checkpoint_and_the_resume_command(qwen_dir, tmp_path, data, capsys, monkeypatch):
    run = tmp_path / "my run"
    args = [
        "train",
        "--base",
        qwen_dir,
        "--data",
        data,
        "--out",
        str(run),
        "--steps",
        "6",
        "--batch-size",
        "2",
        "--save-every",
        "2",
        "--log-every",
        "1",
        "--overwrite",
    ]
    _interrupt_after_checkpoint(monkeypatch, 4)
    assert cli.main(args) == 130
    err = capsys.readouterr().err.split("\n")[-3:]  # the progress bar ended its line: the message has its own lines
    assert err[-1] == ""
    err = err[:-1]
    assert err[-2] == f"causalqwen train: interrupted; the last checkpoint is {run / 'checkpoint-4'} (step 4 of 6)"
    resume = shlex.join(["causalqwen", *args[:-1], "--resume"])  # --overwrite would start over: dropped
    assert err[-1] == f"continue with: {resume}"
    monkeypatch.undo()
    assert cli.main(shlex.split(err[-1].removeprefix("continue with: "))[1:]) == 0  # the printed command works
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoint-6").exists() and (run / "model" / "model.safetensors").exists()


def test_ctrl_c_before_the_first_checkpoint_says_so(qwen_dir, tmp_path, data, capsys, monkeypatch):
    run = tmp_path / "run"
    forward = training_run.loss_and_gradients  # the step as the training run looks it up
    calls = []

    def interrupt_at_step_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    monkeypatch.setattr(training_run, "loss_and_gradients", interrupt_at_step_2)
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(run), "--steps", "4", "--batch-size", "2"]
    assert cli.main(args) == 130
    err = capsys.readouterr().err.split("\n")[-3:-1]
    assert err[-2] == "causalqwen train: interrupted before the first checkpoint (--save-every 500): no step is saved"
    assert err[-1] == f"start again with: {shlex.join(['causalqwen', *args, '--resume'])}"
    monkeypatch.undo()
    assert cli.main(args + ["--resume"]) == 0 and (run / "checkpoint-4").exists()


def test_ctrl_c_elsewhere_exits_130_without_a_traceback(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "generate_text", interrupted)
    assert cli.main(["generate", "--prompt", "x"]) == 130
    assert capsys.readouterr().err.strip() == "causalqwen generate: interrupted"


@pytest.mark.slow
def test_a_real_sigint_during_training(qwen_dir, tmp_path, data):
    run = tmp_path / "run"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # A shell without job control starts background jobs with SIGINT ignored, and Python keeps an ignored
    # SIGINT; the child restores the interactive default, so the test does not depend on how the suite was started.
    launch = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('causalqwen.app.cli', run_name='__main__', alter_sys=True)"
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            launch,
            "train",
            "--base",
            qwen_dir,
            "--data",
            data,
            "--out",
            str(run),
            "--steps",
            "100000",
            "--batch-size",
            "2",
            "--save-every",
            "1",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + budget(120)

        def saved_steps():  # the oldest are removed as the run goes (--save-total-limit 3)
            return [step for name in (os.listdir(run) if run.is_dir() else []) if (step := runs.checkpoint_step(name))]

        while max(saved_steps(), default=0) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert max(saved_steps(), default=0) >= 2
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=budget(60))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert lines[-2].startswith(f"causalqwen train: interrupted; the last checkpoint is {run}{os.sep}checkpoint-")
    assert lines[-1].startswith("continue with: causalqwen train --base") and lines[-1].endswith(" --resume")


# ---------------------------------------------------------------------------------------------
# 7. The command names its flags, the library its keywords
# ---------------------------------------------------------------------------------------------


def test_messages_name_the_command_line_flags(qwen_dir, tmp_path, data, capsys):
    run = tmp_path / "run"
    RunDirectory.claim(run, "train").release()
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(run), "--steps", "1", "--batch-size", "2"]
    assert "holds a previous train run; pass --resume to continue it or --overwrite to replace it" in _fails(
        capsys, args
    )
    assert "argument --overwrite: not allowed with argument --resume" in _fails(
        capsys, args + ["--resume", "--overwrite"]
    )
    assert "--allow-changed-settings applies to --resume only" in _fails(capsys, args + ["--allow-changed-settings"])
    with pytest.raises(ValueError, match="pass resume to continue it or overwrite to replace it"):
        RunDirectory.claim(run, "train")  # the library keeps its keyword names
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        RunDirectory.claim(run, "train", resume=True, overwrite=True)


def test_a_resume_in_another_dtype_is_a_changed_setting(tmp_path, data, capsys, caplog):
    """A bfloat16 run resumed with --dtype float32 trains on in another precision (it ended 7.5e-3 from the
    uninterrupted run, silently): refused like any other changed setting, and named when allowed."""
    run = tmp_path / "run"
    args = ["train", "--base", "tiny", "--data", data, "--out", str(run), "--steps", "2", "--batch-size", "2"]
    assert cli.main(args + ["--dtype", "bfloat16", "--save-every", "1"]) == 0
    message = "the parameters' dtype (--dtype) is bfloat16 in the checkpoint, float32 now"
    assert message in _fails(capsys, args + ["--resume", "--dtype", "float32"])
    with caplog.at_level("WARNING"):
        assert cli.main(args + ["--resume", "--dtype", "float32", "--allow-changed-settings"]) == 0
    assert any(message in record.getMessage() for record in caplog.records)
    assert cli.main(args + ["--resume", "--dtype", "bfloat16"]) == 0  # the run's own dtype resumes as before


# ---------------------------------------------------------------------------------------------
# 8. A mistyped local name fails at once, without the network
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, option",
    [
        (["generate", "--prompt", "x"], "--model"),
        (["convert", "--out", "{tmp}/c"], "--base"),
        (["train", "--data", "{data}", "--out", "{tmp}/r"], "--base"),
    ],
)
def test_a_name_that_is_neither_a_directory_nor_a_hub_id_fails_at_once(
    command, option, tmp_path, data, capsys, monkeypatch
):
    import huggingface_hub.constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a safety net: no test reaches the network
    started = time.perf_counter()
    args = [a.format(tmp=tmp_path, data=data) for a in command] + [option, "model_nope"]
    line = _fails(capsys, args)
    assert time.perf_counter() - started < budget(5)
    assert line.endswith(
        "error: model directory 'model_nope' does not exist (a hub id has the form owner/name, e.g. Qwen/Qwen2.5-0.5B)"
    ), line
    with pytest.raises(OSError, match=r"tokenizer directory 'model_nope' does not exist \(a hub id has the form"):
        NumericTokenizer.from_pretrained("model_nope")


def test_a_hub_id_not_in_the_cache_fails_at_once_when_offline(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    started = time.perf_counter()
    line = _fails(capsys, ["generate", "--model", "someone/not-cached", "--prompt", "x"])
    assert line.endswith(
        "error: model 'someone/not-cached' is no local directory and, with HF_HUB_OFFLINE=1, "
        "not in the local Hugging Face cache either"
    ), line
    assert time.perf_counter() - started < budget(5)


def test_a_file_given_as_a_model_directory_is_named_without_a_hub_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").write_text("x")
    line = _fails(capsys, ["generate", "--model", "weights", "--prompt", "x"])
    assert line.endswith("error: model directory 'weights' exists but is not a directory"), line


@pytest.mark.parametrize(
    "command, option",
    [
        (["generate", "--prompt", "x"], "--model"),
        (["demo"], "--out"),
        (["convert", "--out", "c"], "--base"),
        (["convert", "--base", "tiny"], "--out"),
        (["train", "--data", "d", "--out", "o"], "--base"),
        (["train", "--base", "tiny", "--out", "o"], "--data"),
        (["train", "--base", "tiny", "--data", "d", "--out", "o"], "--eval-data"),
        (["train", "--base", "tiny", "--data", "d"], "--out"),
    ],
)
def test_an_empty_path_is_refused_by_option(command, option, capsys):
    line = _fails(capsys, command + [option, ""])
    assert line.endswith(f"argument {option}: must name a file, directory or hub id, got ''"), line


# ---------------------------------------------------------------------------------------------
# 9. Optimisation settings the optimizer cannot hold, and options that apply to another only
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value, message",
    [
        (
            "--weight-decay",
            "1e300",
            "weight_decay must be a finite number within float32's range (at most 3.40282e+38), got 1e+300",
        ),
        (
            "--learning-rate",
            "1e39",
            "learning_rate must be a finite number within float32's range (at most 3.40282e+38), got 1e+39",
        ),
        ("--learning-rate", "1e300", "learning_rate must be a finite number within float32's range"),
        ("--max-grad-norm", "1e39", "max_grad_norm must be a finite number within float32's range"),
        (
            "--weight-decay",
            "1e4",
            "learning_rate * weight_decay must be < 1 (AdamW multiplies the weights by "
            "1 - learning_rate * weight_decay each step), got learning_rate=0.0001 * "
            "weight_decay=10000.0 = 1",
        ),
    ],
)
def test_settings_that_would_overflow_or_flip_the_weights_are_refused(
    qwen_dir, tmp_path, data, capsys, option, value, message
):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        qwen_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        option,
        value,
    ]
    assert message in _fails(capsys, args)
    assert not out.exists()  # refused at the door: nothing written


def test_divergence_dual_lr_without_the_bound_is_refused(qwen_dir, tmp_path, data, capsys):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        qwen_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--divergence-dual-lr",
        "5",
    ]
    assert "--divergence-dual-lr applies to --max-u-divergence only" in _fails(capsys, args)
    assert not out.exists()


@pytest.mark.parametrize(
    "options, named",
    [
        (["--lora-rank", "4"], "--lora-rank apply"),
        (["--lora-alpha", "0"], "--lora-alpha apply"),
        (["--lora-rank", "8", "--lora-alpha", "16"], "--lora-rank and --lora-alpha apply"),
    ],
)
def test_lora_options_with_another_preset_are_refused_not_ignored(qwen_dir, tmp_path, data, capsys, options, named):
    out = tmp_path / "run"
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(out), "--steps", "1", "--preset", "causal"]
    line = _fails(capsys, args + options)
    assert f"{named} to --preset lora only (the preset is 'causal')" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, start",
    [
        (["convert", "--base", "no_such_base_dir", "--out", "out"], "causalqwen convert: error: model directory"),
        (
            ["generate", "--prompt", "hi", "--number-resolution", "junk"],
            "causalqwen generate: error: argument --number",
        ),
        (["train", "--bogus"], "causalqwen train: error: the following arguments are required"),
        (["generate", "--prompt", "hi", "--top-k", "3"], "causalqwen generate: error: --temperature, --top-k"),
        (["bogus"], "causalqwen: error: argument COMMAND: invalid choice: 'bogus'"),
    ],
)
def test_every_command_line_error_is_one_line_that_names_the_command(tmp_path, monkeypatch, capsys, argv, start):
    """A usage error (argparse's) and a data error alike: one line on stderr, ``causalqwen COMMAND: error: ...``, exit
    status 2, no usage block, nothing written."""
    from causalqwen.app import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(start), captured.err
    assert list(tmp_path.iterdir()) == []


def test_walkthrough_refuses_an_empty_text_before_it_prints_anything(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["walkthrough", "--text", ""])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert (
        captured.err.strip()
        .splitlines()[-1]
        .endswith("argument --text: must hold at least one character (an empty text has no token to read)")
    )
