"""Files the project did not write: a run removes only what it wrote, checks every option before it writes
anything, and a tokenizer's number token is never one of its other tokens.

- **Old checkpoints** (``save_total_limit``) are removed file by file, only the files the checkpoint's record
  (``checkpoint_files.json``) lists, by name, size and SHA-256; a checkpoint holding anything else -- a user's
  note, a subdirectory, a symbolic link, a file that replaced one of the run's -- is kept whole, with a warning
  naming it. Links are never followed.
- **Options before the claim**: a refused ``causalqwen train`` prints one line, exits 2 and leaves ``--out`` as
  it was (absent, or the previous run untouched), so the same command without the bad option then runs.
- **The number token** named by a ``tokenizer_config.json`` (or passed to the constructor) must not be a token
  the wrapped tokenizer already has for another role (end of text, padding, its chat template's specials) nor an
  ordinary token; the error names the file, the token and the clash.
"""

import json
import logging
import os
import re
import shutil
import sys

import pytest
import torch

from causalqwen import NumericTokenizer, train
from causalqwen.app import cli, runs
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.files.rundir import RunDirectory
from causalqwen.training import TrainingConfig

CONFIG = dict(
    steps=3,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=1,
    preset="all",
    eval_every=100,
    save_every=1,
    log_every=1,
    seed=0,
)
NOTE = "my notes on this checkpoint\n"


def _model():
    return build_tiny_causal_lm(seed=0, init_seed=0).model


def _data(tokenizer, n=16):
    return TextDataset(synthetic_texts(n, seed=0), tokenizer, max_length=32)


@pytest.fixture(scope="module")
def three_checkpoints(tokenizer, tmp_path_factory):
    """A finished run with checkpoint-1, -2 and -3, every one kept (no limit)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=str(out), progress=False)
    return out


def _copy(run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run, target, symlinks=True)
    return target


def _checkpoints(run):
    return sorted(name for name in os.listdir(run) if name.startswith("checkpoint-"))


def _tree(path):
    """``{relative path: bytes, or the link's target}`` of everything under ``path``, links not followed."""
    found = {}
    for root, directories, files in os.walk(path):
        for name in directories + files:
            full = os.path.join(root, name)
            key = os.path.relpath(full, path)
            if os.path.islink(full):
                found[key] = "-> " + os.readlink(full)
            elif os.path.isfile(full):
                with open(full, "rb") as handle:
                    found[key] = handle.read()
            else:
                found[key] = "dir"
    return found


# =============================================================================================
# save_total_limit removes only what the run wrote
# =============================================================================================


def test_the_record_lists_every_file_of_a_checkpoint_with_its_sha256(three_checkpoints):
    import hashlib

    checkpoint = three_checkpoints / "checkpoint-2"
    record = json.loads((checkpoint / runs.CHECKPOINT_RECORD).read_text())["files"]
    others = sorted(name for name in os.listdir(checkpoint) if name != runs.CHECKPOINT_RECORD)
    assert sorted(record) == others and "model.safetensors" in record
    for name, entry in record.items():
        content = (checkpoint / name).read_bytes()
        assert entry == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}, name


def test_a_run_with_a_limit_keeps_a_checkpoint_holding_a_users_note_and_removes_the_others(
    tokenizer, tmp_path, killed_after_first_save, caplog
):
    """A run killed after checkpoint-1; the user writes a note into it; the run resumes with a limit of 1."""
    out = tmp_path / "run"
    config = TrainingConfig(**CONFIG | {"steps": 4})
    with killed_after_first_save():
        train(_model(), _data(tokenizer), config, out_dir=str(out), progress=False)
    (out / "checkpoint-1" / "notes.txt").write_text(NOTE)
    kept = _tree(out / "checkpoint-1")
    with caplog.at_level(logging.WARNING, logger="causalqwen.app.runs"):
        train(
            _model(),
            _data(tokenizer),
            TrainingConfig(**CONFIG | {"steps": 4, "save_total_limit": 1}),
            out_dir=str(out),
            resume=True,
            progress=False,
        )
    assert _checkpoints(out) == ["checkpoint-1", "checkpoint-4"]
    assert _tree(out / "checkpoint-1") == kept  # whole: the run's files beside the note, the note as written
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings and all(os.path.join(str(out), "checkpoint-1") in line and "notes.txt" in line for line in warnings)
    assert "never deletes what it did not write" in warnings[0]


@pytest.mark.parametrize(
    "plant",
    [
        "note",
        "subdirectory",
        "link_to_a_file",
        "link_to_a_directory",
        "own_weights",
        "unrecorded_name",
        "record_missing",
    ],
)
def test_an_old_checkpoint_holding_what_the_run_did_not_write_is_kept_whole(three_checkpoints, tmp_path, plant, caplog):
    run = _copy(three_checkpoints, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.txt").write_text(NOTE)
    old = run / "checkpoint-1"
    if plant == "note":
        (old / "notes.txt").write_text(NOTE)
        foreign = "notes.txt"
    elif plant == "subdirectory":
        (old / "eval").mkdir()
        (old / "eval" / "samples.jsonl").write_text(NOTE)
        foreign = "eval"
    elif plant == "link_to_a_file":
        (old / "precious.txt").symlink_to(outside / "precious.txt")
        foreign = "precious.txt"
    elif plant == "link_to_a_directory":
        (old / "elsewhere").symlink_to(outside, target_is_directory=True)
        foreign = "elsewhere"
    elif plant == "own_weights":  # the user's own model.safetensors in place of the run's: same name, same size
        shutil.copyfile(run / "checkpoint-3" / "model.safetensors", old / "model.safetensors")
        assert (old / "model.safetensors").stat().st_size == (run / "checkpoint-2" / "model.safetensors").stat().st_size
        foreign = "model.safetensors"
    elif plant == "unrecorded_name":  # a name a checkpoint may hold (with a bound), but this one never did
        (old / "divergence_bound.json").write_text("{}")
        foreign = "divergence_bound.json"
    else:  # a checkpoint whose record is gone (as one written by an older causalqwen): nothing is known to be ours
        (old / runs.CHECKPOINT_RECORD).unlink()
        foreign = "model.safetensors"
    before = _tree(old)
    with caplog.at_level(logging.WARNING, logger="causalqwen.app.runs"):
        removed = runs.remove_old_checkpoints(str(run), 1)
    assert removed == [str(run / "checkpoint-2")]
    assert _checkpoints(run) == ["checkpoint-1", "checkpoint-3"]
    assert _tree(old) == before
    assert (outside / "precious.txt").read_text() == NOTE and os.listdir(outside) == ["precious.txt"]
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert str(old) in warning and foreign in warning


def test_a_hard_link_the_user_made_to_a_checkpoint_file_keeps_its_content(three_checkpoints, tmp_path):
    """The run's own file is removed from the checkpoint; the user's second name for it stays, with its bytes."""
    run = _copy(three_checkpoints, tmp_path)
    weights = (run / "checkpoint-1" / "model.safetensors").read_bytes()
    kept = tmp_path / "best.safetensors"
    os.link(run / "checkpoint-1" / "model.safetensors", kept)
    assert runs.remove_old_checkpoints(str(run), 2) == [str(run / "checkpoint-1")]
    assert kept.read_bytes() == weights and _checkpoints(run) == ["checkpoint-2", "checkpoint-3"]


def test_links_and_files_named_like_checkpoints_are_neither_counted_nor_followed(three_checkpoints, tmp_path):
    run = _copy(three_checkpoints, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoint-1", outside / "checkpoint-copy")  # a complete checkpoint, record included
    (run / "checkpoint-9").symlink_to(outside / "checkpoint-copy", target_is_directory=True)
    (run / "checkpoint-8").write_text("a file named like a checkpoint")
    before = _tree(outside)
    assert runs.remove_old_checkpoints(str(run), 1) == [str(run / "checkpoint-1"), str(run / "checkpoint-2")]
    assert _checkpoints(run) == ["checkpoint-3", "checkpoint-8", "checkpoint-9"]
    assert _tree(outside) == before and (run / "checkpoint-8").read_text().startswith("a file")
    assert os.path.islink(run / "checkpoint-9")


def test_remove_checkpoint_never_follows_a_link_to_read_it(three_checkpoints, tmp_path):
    """A checkpoint file replaced by a link to a copy of its own bytes elsewhere: the link is not the run's file."""
    run = _copy(three_checkpoints, tmp_path)
    copy = tmp_path / "history-copy.json"
    shutil.copyfile(run / "checkpoint-1" / "history.json", copy)
    (run / "checkpoint-1" / "history.json").unlink()
    (run / "checkpoint-1" / "history.json").symlink_to(copy)
    assert runs.remove_checkpoint(str(run / "checkpoint-1")) == ["history.json"]
    assert os.path.islink(run / "checkpoint-1" / "history.json") and copy.exists()
    assert runs.remove_checkpoint(str(run / "checkpoint-2")) == [] and not (run / "checkpoint-2").exists()


def test_remove_checkpoint_refuses_a_link_or_a_file_and_leaves_it(three_checkpoints, tmp_path):
    run = _copy(three_checkpoints, tmp_path)
    (run / "checkpoint-8").write_text("a file named like a checkpoint")
    (run / "checkpoint-9").symlink_to(run / "checkpoint-1", target_is_directory=True)
    with pytest.raises(OSError, match="checkpoint-8' is not a directory"):
        runs.remove_checkpoint(str(run / "checkpoint-8"))
    with pytest.raises(OSError, match="checkpoint-9' is a symbolic link"):
        runs.remove_checkpoint(str(run / "checkpoint-9"))
    assert (run / "checkpoint-8").read_text().startswith("a file") and os.path.islink(run / "checkpoint-9")
    assert (run / "checkpoint-1" / "model.safetensors").is_file()


def test_a_directory_of_someone_else_at_a_step_to_be_saved_stops_the_run_before_its_first_step(tokenizer, tmp_path):
    run = tmp_path / "run"
    claimed = RunDirectory.claim(run, "train")
    (run / "checkpoint-2").mkdir()  # not written by the run: no record
    (run / "checkpoint-2" / "notes.txt").write_text(NOTE)
    try:
        with pytest.raises(ValueError, match=r"already holds checkpoint-2, which this run would write"):
            train(_model(), _data(tokenizer), TrainingConfig(**CONFIG), out_dir=claimed, progress=False)
    finally:
        claimed.release()
    assert (run / "checkpoint-2" / "notes.txt").read_text() == NOTE and _checkpoints(run) == ["checkpoint-2"]
    assert not (run / "checkpoint-2.partial").exists()


def test_a_killed_saves_leftover_is_removed_unless_it_holds_something_else(tokenizer, tmp_path, three_checkpoints):
    run = _copy(three_checkpoints, tmp_path)
    leftover = run / "checkpoint-4.partial"
    shutil.copytree(run / "checkpoint-3", leftover)  # what a save killed before its rename leaves
    (leftover / runs.CHECKPOINT_RECORD).unlink()
    (leftover / "model.safetensors").write_bytes(b"cut short")
    (leftover / "notes.txt").write_text(NOTE)
    config = TrainingConfig(**CONFIG | {"steps": 4})
    with pytest.raises(
        OSError, match=r"checkpoint-4.partial' holds notes.txt, which a checkpoint's save does not write"
    ):
        train(
            _model(),
            _data(tokenizer),
            config,
            out_dir=str(run),
            resume=True,
            progress=False,
            allow_changed_settings=True,
        )
    assert (leftover / "notes.txt").read_text() == NOTE and (
        leftover / "model.safetensors"
    ).read_bytes() == b"cut short"
    (leftover / "notes.txt").unlink()
    train(
        _model(), _data(tokenizer), config, out_dir=str(run), resume=True, progress=False, allow_changed_settings=True
    )
    assert not leftover.exists() and _checkpoints(run) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
    ]
    assert (run / "checkpoint-4" / runs.CHECKPOINT_RECORD).is_file()


# =============================================================================================
# causalqwen train: every option checked before anything is written to --out
# =============================================================================================


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return str(path)


def _fails(capsys, args):
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    # transformers' own progress bar of loading the base may come first (it is on unless a caller turned it off)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("Loading weights:")]
    assert exited.value.code == 2, err
    assert err[-1].startswith(f"causalqwen {args[0]}: error: ") and not any("Traceback" in line for line in err), err
    assert len(err) == 1, err  # one line
    return err[-1]


@pytest.fixture
def data(tmp_path):
    return _jsonl(tmp_path / "train.jsonl", ["a 1", "b 2", "c 3", "d 4"])


BAD_OPTIONS = [
    (["--report-to", "tensorboard"], "report_to='tensorboard' needs the tensorboard package"),
    (["--report-to", "wandb"], "report_to='wandb' needs the wandb package"),
    (["--batch-size", "64"], "the dataset has 4 texts: too few for one batch of 64 on 1 process(es)"),
]


@pytest.fixture
def without_sinks(monkeypatch):
    """tensorboard and wandb not importable, as on a machine without them (what a None in sys.modules does)."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    """The tiny CausalQwen saved with its tokenizer (a --base that loads without a conversion)."""
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    directory = tmp_path_factory.mktemp("causal_tiny")
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)
    return str(directory)


def test_a_refused_option_leaves_no_output_directory_and_the_command_then_runs(
    causal_dir, tmp_path, data, capsys, without_sinks
):
    out = tmp_path / "run"
    args = ["train", "--base", causal_dir, "--data", data, "--out", str(out), "--steps", "1", "--batch-size", "2"]
    for bad, message in BAD_OPTIONS:
        assert message in _fails(capsys, args + bad)
        assert not out.exists(), bad
    assert cli.main(args) == 0
    assert (out / "model" / "config.json").is_file()


def test_a_refused_option_leaves_a_previous_run_untouched(causal_dir, tmp_path, data, capsys, without_sinks):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        causal_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--save-every",
        "1",
    ]
    assert cli.main(args) == 0
    capsys.readouterr()
    before = _tree(out)
    for again in ("--resume", "--overwrite"):
        for bad, message in BAD_OPTIONS:
            assert message in _fails(capsys, args + [again] + bad)
            assert _tree(out) == before, (again, bad)  # the lock, the marker, the config, the checkpoints, the model
    assert cli.main(args + ["--overwrite"]) == 0


def test_texts_without_a_next_token_are_refused_before_the_claim(causal_dir, tmp_path, capsys):
    out = tmp_path / "run"
    data = _jsonl(tmp_path / "train.jsonl", ["", ""])
    args = ["train", "--base", causal_dir, "--data", data, "--out", str(out), "--steps", "1", "--batch-size", "2"]
    assert "none of the 2 training texts has two tokens" in _fails(capsys, args)
    assert not out.exists()


# =============================================================================================
# The number token is never another token of the wrapped tokenizer
# =============================================================================================


def _saved_tokenizer(tmp_path, num_token):
    """The tiny tokenizer saved by NumericTokenizer, its tokenizer_config.json then naming ``num_token``."""
    NumericTokenizer(build_tiny_base(seed=0)[1]).save_pretrained(tmp_path / "tok")
    config_file = tmp_path / "tok" / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"num_token": num_token}))
    return tmp_path / "tok", config_file


CLASHES = [
    ("<|endoftext|>", "the wrapped tokenizer's eos_token, unk_token and pad_token (id 600)"),
    ("<|im_start|>", "one of the wrapped tokenizer's extra special tokens (id 601)"),
    ("<|im_end|>", "one of the wrapped tokenizer's extra special tokens (id 602)"),
]


@pytest.mark.parametrize("num_token, clash", CLASHES)
def test_a_tokenizer_config_naming_another_special_token_as_the_number_token_is_refused(tmp_path, num_token, clash):
    from transformers import AutoTokenizer

    directory, config_file = _saved_tokenizer(tmp_path, num_token)
    expected = f"{str(config_file)!r} names num_token {num_token!r}, which is {clash}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}: numbers would encode as that token"):
        NumericTokenizer.from_pretrained(directory)
    with pytest.raises(ValueError, match=re.escape(expected)):
        AutoTokenizer.from_pretrained(directory, trust_remote_code=True)


def test_the_pad_token_set_to_the_number_token_is_refused(tmp_path):
    directory, config_file = _saved_tokenizer(tmp_path, "<NUM>")
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(config | {"pad_token": "<NUM>"}))
    with pytest.raises(
        ValueError,
        match=f"{re.escape(repr(str(config_file)))} names num_token '<NUM>', which is the "
        r"wrapped tokenizer's pad_token \(id 603\)",
    ):
        NumericTokenizer.from_pretrained(directory)


def test_an_ordinary_token_as_the_number_token_is_refused_naming_the_file(tmp_path):
    hf_tokenizer = build_tiny_base(seed=0)[1]
    ordinary = next(token for token, index in hf_tokenizer.get_vocab().items() if index == 100)
    directory, config_file = _saved_tokenizer(tmp_path, ordinary)
    with pytest.raises(
        ValueError,
        match=f"names num_token {re.escape(repr(ordinary))}, which is an ordinary token of the "
        r"wrapped tokenizer \(id 100\)",
    ):
        NumericTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("num_token, clash", CLASHES)
def test_the_constructor_refuses_the_same_tokens_by_name(num_token, clash):
    hf_tokenizer = build_tiny_base(seed=0)[1]
    size = len(hf_tokenizer)
    with pytest.raises(
        ValueError,
        match=f"^num_token {re.escape(repr(num_token))} is {re.escape(clash)}: numbers would encode as that token",
    ):
        NumericTokenizer(hf_tokenizer, num_token=num_token)
    assert len(hf_tokenizer) == size  # nothing added


def test_the_constructor_refuses_an_ordinary_token(tokenizer):
    hf_tokenizer = build_tiny_base(seed=0)[1]
    ordinary = next(token for token, index in hf_tokenizer.get_vocab().items() if index == 100)
    with pytest.raises(
        ValueError,
        match=f"^num_token {re.escape(repr(ordinary))} is an ordinary token of the wrapped "
        r"tokenizer \(id 100\), which ordinary text also produces",
    ):
        NumericTokenizer(hf_tokenizer, num_token=ordinary)


def test_an_explicit_num_token_argument_is_named_as_the_argument(tmp_path):
    directory, _ = _saved_tokenizer(tmp_path, "<NUM>")
    with pytest.raises(ValueError, match=r"^num_token '<\|endoftext\|>' is the wrapped tokenizer's eos_token"):
        NumericTokenizer.from_pretrained(directory, num_token="<|endoftext|>")


def test_the_number_token_added_before_is_used_again(tmp_path):
    """A directory saved by NumericTokenizer, and a tokenizer wrapped twice: <NUM> keeps its id, numbers encode as
    it."""
    directory, _ = _saved_tokenizer(tmp_path, "<NUM>")
    loaded = NumericTokenizer.from_pretrained(directory)
    assert loaded.num_token_id == 603 and len(loaded) == 604
    again = NumericTokenizer(loaded.hf_tokenizer)
    assert again.num_token_id == 603 and len(again) == 604
    ids, values = loaded.encode("costs 12.5 yuan")
    assert ids.count(603) == 1 and values[ids.index(603)] == 12.5 and loaded.eos_token_id not in ids
    custom = NumericTokenizer(build_tiny_base(seed=0)[1], num_token="<QTY>")
    assert custom.num_token_id == 603 and torch.tensor(custom.encode("3 apples")[0]).eq(603).sum() == 1
