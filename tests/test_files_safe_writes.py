"""Writing files (`causalqwen.files.safe_writes`): nothing is written through a symbolic link nor into a
hard-linked file.

``open_for_writing`` refuses links and stays inside its root; ``check_write_targets`` looks only at the names it is
given; ``save_pretrained`` of the model and of the tokenizer, the adapter's and the abduction network's savers and
the demo's plots refuse a planted link by name, and what the link points to keeps its content. A Ctrl-C while a
file is being opened stays a Ctrl-C and closes the file once.
"""

import codecs
import os

import pytest
from tiny_runs import SECRET, outside_file, tiny_model

from causalqwen import NumericTokenizer, save_abduction
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.rundir import (
    MARKER,
    check_write_targets,
    open_for_writing,
)
from causalqwen.integrations.lora import add_lora, save_lora


class _Interrupted(codecs.IncrementalEncoder):
    """An encoder whose construction is a Ctrl-C: the moment inside ``open`` after the descriptor has an owner."""

    def __init__(self, errors="strict"):
        raise KeyboardInterrupt


def _interrupting_codec(name):
    return codecs.CodecInfo(codecs.utf_8_encode, codecs.utf_8_decode, incrementalencoder=_Interrupted, name=name)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_for_writing_refuses_links_and_stays_inside_its_root(tmp_path):
    secret = outside_file(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(secret, root / MARKER)
    for mode in ("w", "a", "wb", "ab"):
        with pytest.raises(OSError, match=rf"'{root / MARKER}' is a symbolic link"):
            open_for_writing(root / MARKER, mode)
    os.symlink(secret.parent, root / "model")  # a linked directory between the root and the file
    with pytest.raises(OSError, match=rf"'{root / 'model'}' is a symbolic link"):
        open_for_writing(root / "model" / "config.json", root=root)
    with pytest.raises(OSError, match="lies outside the run directory"):
        open_for_writing(tmp_path / "x.json", root=root)
    os.mkfifo(root / "fifo")
    with pytest.raises(OSError, match=r"fifo' exists and is not a regular file"):
        open_for_writing(root / "fifo")
    assert secret.read_text() == SECRET and sorted(os.listdir(secret.parent)) == ["secret.txt"]
    with open_for_writing(root / "plain.txt") as handle:  # an ordinary file: written, then truncated on rewrite
        handle.write("first, longer")
    with open_for_writing(root / "plain.txt") as handle:
        handle.write("second")
    with open_for_writing(root / "plain.txt", "a") as handle:
        handle.write("!")
    assert (root / "plain.txt").read_text() == "second!"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_ctrl_c_while_a_file_is_being_opened_stays_a_ctrl_c_and_closes_the_file_once(tmp_path):
    # A Ctrl-C that lands while the text layer is built used to close the descriptor twice: the second
    # close was an OSError (EBADF) that replaced the KeyboardInterrupt, and `causalqwen train` exited 2, not 130.
    codecs.register(_interrupting_codec)
    try:
        before = _open_descriptors()
        for mode in ("w", "a"):
            with pytest.raises(KeyboardInterrupt):
                open_for_writing(tmp_path / "metrics.jsonl", mode, encoding="interrupting_codec")
        assert _open_descriptors() == before
    finally:
        codecs.unregister(_interrupting_codec)


def test_the_demo_plots_are_never_written_through_a_link(tmp_path):
    pytest.importorskip("matplotlib")
    from causalqwen.app.demo import _plots

    secret = outside_file(tmp_path, "plot.png")
    os.symlink(secret, tmp_path / "loss.png")
    history = [{"step": step, "train/total_loss": 1.0 / step, "eval/accuracy": 0.5} for step in (1, 2)]
    with pytest.raises(OSError, match=r"loss\.png' is a symbolic link"):
        _plots(history, str(tmp_path))
    assert secret.read_text() == SECRET
    os.remove(tmp_path / "loss.png")
    assert _plots(history, str(tmp_path)) == [str(tmp_path / "loss.png"), str(tmp_path / "metrics.png")]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "generation_config.json", "causalqwen_auto.py"])
def test_model_save_pretrained_refuses_a_planted_link(tiny, tmp_path, name):
    target, secret = tmp_path / "model", outside_file(tmp_path)
    target.mkdir()
    os.symlink(secret, target / name)
    with pytest.raises(OSError, match=rf"'{target / name}': symbolic link where causalqwen is about to write"):
        tiny[0].save_pretrained(target)
    assert secret.read_text() == SECRET and os.listdir(target) == [name]


def test_save_directories_that_are_links_are_refused(tiny, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "model")
    peft_model = add_lora(build_tiny_causal_lm(seed=0, init_seed=0).model, rank=2)
    for save in (
        tiny[0].save_pretrained,
        tiny[1].save_pretrained,
        lambda path: save_lora(peft_model, path),
        lambda path: save_abduction(tiny[0], path),
    ):
        with pytest.raises(OSError, match=rf"'{tmp_path / 'model'}' is a symbolic link"):
            save(tmp_path / "model")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize(
    "saver, name",
    [
        ("tokenizer", "tokenizer_config.json"),
        ("tokenizer", "tokenizer.json"),
        ("lora", "adapter_model.safetensors"),
        ("lora", "adapter_config.json"),
        ("lora", "README.md"),
        ("abduction", "abduction.safetensors"),
        ("abduction", "abduction.safetensors.tmp"),
    ],
)
def test_the_other_savers_refuse_a_planted_link(tiny, tmp_path, saver, name):
    target, secret = tmp_path / "out", outside_file(tmp_path)
    target.mkdir()
    os.symlink(secret, target / name)
    save = {
        "tokenizer": tiny[1].save_pretrained,
        "lora": lambda path: save_lora(add_lora(tiny_model(), rank=2), path),
        "abduction": lambda path: save_abduction(tiny[0], path),
    }[saver]
    with pytest.raises(OSError, match=rf"'{target / name}': symbolic link where causalqwen is about to write"):
        save(target)
    assert secret.read_text() == SECRET and os.listdir(target) == [name]


def test_a_hard_linked_weight_file_is_refused_before_saving(tiny, tmp_path):
    target, secret = tmp_path / "model", outside_file(tmp_path)
    target.mkdir()
    os.link(secret, target / "model.safetensors")
    with pytest.raises(OSError, match=r"model\.safetensors' has 2 hard links"):
        tiny[0].save_pretrained(target)
    assert secret.read_text() == SECRET


def test_tokenizer_save_pretrained_onto_a_file_names_the_path(tiny, tmp_path):
    file = tmp_path / "tokenizer"
    file.write_text(SECRET)
    with pytest.raises(OSError, match=rf"'{file}' exists and is not a directory"):
        tiny[1].save_pretrained(file)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        tiny[1].save_pretrained(3)
    assert file.read_text() == SECRET
    saved = tiny[1].save_pretrained(tmp_path / "fine")  # an ordinary directory still works
    assert sorted(os.path.basename(name) for name in saved) == [
        "causalqwen_auto.py",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert NumericTokenizer.from_pretrained(tmp_path / "fine").num_token_id == tiny[1].num_token_id


def test_check_write_targets_only_looks_at_the_names_it_is_given(tmp_path):
    secret = outside_file(tmp_path)
    os.symlink(secret, tmp_path / "data.jsonl")  # a user's link beside the outputs: not a name that is written
    check_write_targets(tmp_path, ("config.json", "model*.safetensors"))
    os.symlink(secret, tmp_path / "model-00001-of-00002.safetensors")
    with pytest.raises(OSError, match=r"model-00001-of-00002\.safetensors'"):
        check_write_targets(tmp_path, ("config.json", "model*.safetensors"))
