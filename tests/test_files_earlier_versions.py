"""Directories saved by earlier versions load with the code of today and give the outputs they gave.

``tests/data/saved_directories/<name>/`` is a directory written by ``save_pretrained`` at the commit ``<name>``
names (its ``causalqwen_auto.py`` imports that version's module paths), and ``<name>.json`` beside it what the
directory gave when it was recorded: ``tests/data/saved_directories/record.py``, run with that version's code,
wrote both (its docstring says how). ``main_41679d3`` is the tiny base converted with the drafts' values
(gamma = 10, C = 100: its config.json writes no threshold rule), ``main_3b621fe`` with the calibrated ones.
The code of 41679d3 no longer runs on the installed transformers (its output class refuses the ``cache`` keyword
that transformers 5.24 passes), so ``main_41679d3.json`` was recorded by cd833d2, which writes the same bytes; the
parts 41679d3 still runs, its tokenizer's encodings and its config's values, are the recorded ones.

Each directory is loaded in a fresh interpreter, as a user's script meets it: first through transformers'
``AutoConfig`` / ``AutoTokenizer`` / ``AutoModelForCausalLM`` / ``pipeline`` with ``trust_remote_code=True``
(which import the directory's ``causalqwen_auto.py``, hence the old module paths), then through
``causalqwen.CausalQwenForCausalLM.from_pretrained`` and the other classes of the top-level namespace.

Tolerances: ids, masks, classes and texts exactly; the tokenizer's values exactly (a literal's float32 value is
one number). The forward laws, the loss and the generated values to rtol 1e-6: float32 keeps 24 bits (eps 1.2e-7),
and an implementation that orders the same sums differently moves a value by a few units in the last place, not
by eight; a sum of signed values is compared against the sum of their magnitudes, which bounds its rounding (a
generated value near 0, -0.0023747, moved by 1.2e-7 when transformers 5.25 replaced 5.24: a unit in the last place
of the row's largest value, 12). A text with every float32 digit of those values: the words exactly, the numbers
so.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import pytest
from wall_clock import budget

SAVED = Path(__file__).parent / "data" / "saved_directories"
DIRECTORIES = ["main_41679d3", "main_3b621fe"]
RTOL = 1e-6

# Run in a fresh interpreter: the Auto classes first (so that the directory's causalqwen_auto.py is the first import
# of causalqwen, as in a user's script), then causalqwen's own classes, each part's error kept by name.
LOAD = r"""
import importlib.util, json, sys, traceback
from pathlib import Path

spec = importlib.util.spec_from_file_location("record", sys.argv[1])
record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record)
directory = Path(sys.argv[2])
found = {}


def attempt(name, make):
    try:
        found[name] = make()
    except Exception as error:
        found[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def today_only():
    import causalqwen

    tokenizer = causalqwen.NumericTokenizer.from_pretrained(directory)
    literal = causalqwen.CausalQwenForCausalLM.from_pretrained(directory, loss_algorithm="literal").eval()
    encoding = tokenizer(record.TEXTS[:1])
    with torch.no_grad():
        loss = literal(input_ids=encoding["input_ids"], numeric_values=encoding["numeric_values"],
                       labels=encoding["input_ids"]).loss
    _, _, model, generator = record.load_with_causalqwen(directory)
    bias = {(model.config.num_token_id,): record.NUM_BIAS}
    text = generator(record.PROMPT, max_new_tokens=record.NEW_TOKENS, sequence_bias=bias, number_resolution=None)
    return {"literal_loss": loss.item(), "every_digit_text": text[0]["generated_text"]}


attempt("auto", lambda: record.outputs(*record.load_with_auto(directory), "today"))
import torch
attempt("causalqwen", lambda: record.outputs(*record.load_with_causalqwen(directory), "today"))
attempt("today_only", today_only)
Path(sys.argv[3]).write_text(json.dumps(found), encoding="utf-8")
"""


@pytest.fixture(scope="module", params=DIRECTORIES)
def loaded(request, tmp_path_factory):
    """``(recorded, found)``: the directory's recorded outputs and what a fresh interpreter finds today."""
    name = request.param
    work = tmp_path_factory.mktemp(name)
    out = work / "found.json"
    result = run_fresh([LOAD, str(SAVED / "record.py"), str(SAVED / name), str(out)], work)
    assert result.returncode == 0 and out.exists(), result.stderr[-4000:]
    recorded = json.loads((SAVED / f"{name}.json").read_text(encoding="utf-8"))
    return name, recorded, json.loads(out.read_text(encoding="utf-8"))


def part(found: dict, name: str) -> dict:
    """One part of what the interpreter found; a part that raised fails the test with its error."""
    assert "error" not in found[name], f"{name}: {found[name].get('error')}\n{found[name].get('traceback', '')}"
    return found[name]


def assert_close(actual, expected, what: str) -> None:
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64), rtol=RTOL, atol=0, err_msg=what
    )


def assert_close_values(actual, expected, what: str) -> None:
    """A row of generated values: each is a signed sum fed back into the next step, so its rounding is bounded by the
    magnitudes it sums, about the row's largest value (the prompt's numbers among them), not by its own size."""
    expected = np.asarray(expected, dtype=np.float64)
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), expected, rtol=RTOL, atol=RTOL * scale, err_msg=what
    )


def assert_same_text_close_numbers(actual: str, expected: str) -> None:
    """Two texts of generated numbers: the words exactly, the numbers as `assert_close_values` compares them."""
    from causalqwen.numbers import find_numbers

    found, wanted = find_numbers(actual), find_numbers(expected)
    assert [actual[: found[0].start]] == [expected[: wanted[0].start]] and len(found) == len(wanted)
    assert_close_values([m.value for m in found], [m.value for m in wanted], "the text's numbers")


def written_at_prompt_resolution(value: float) -> str:
    """A generated value as the pipeline writes it by default (docs/decisions.md, D17): at
    h = min(h_prompt, 10^(floor(log10|v|) - 1)), half to even on the float32 value's exact decimal expansion. The
    prompt ("12 eggs", "3 boxes") states units: h_prompt = 1."""
    exact = Decimal(float(np.float32(value)))
    exponent = 0 if exact == 0 else min(0, exact.adjusted() - 1)  # adjusted() = floor(log10|v|), exactly
    return format(exact.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_EVEN), "f")


@pytest.mark.parametrize("loader", ["auto", "causalqwen"])
def test_the_directory_loads_causalqwens_classes(loaded, loader):
    _, recorded, found = loaded
    assert part(found, loader)["classes"] == recorded["classes"]


@pytest.mark.parametrize("loader", ["auto", "causalqwen"])
def test_the_config_reads_back_the_values_it_was_saved_with(loaded, loader):
    name, recorded, found = loaded
    config = part(found, loader)["config"]
    for field in ("abduction_scale_init", "ovr_threshold", "loss_algorithm", "num_token_id"):
        assert config[field] == recorded["config"][field], field
    if recorded["config"]["ovr_threshold_init"] is not None:
        assert config["ovr_threshold_init"] == recorded["config"]["ovr_threshold_init"]
    if name == "main_41679d3":  # saved with the drafts' values, which its config.json does not all write
        assert "ovr_threshold_init" not in (SAVED / name / "config.json").read_text(encoding="utf-8")
        assert (config["abduction_scale_init"], config["ovr_threshold"]) == (10.0, 100.0)
        assert config["ovr_threshold_init"] in (None, "fixed")


@pytest.mark.parametrize("loader", ["auto", "causalqwen"])
def test_the_tokenizer_encodes_as_it_did(loaded, loader):
    _, recorded, found = loaded
    assert part(found, loader)["tokenizer"] == recorded["tokenizer"]


@pytest.mark.parametrize("loader", ["auto", "causalqwen"])
def test_the_forward_laws_and_the_loss_are_the_recorded_ones(loaded, loader):
    _, recorded, found = loaded
    today = part(found, loader)
    for law, expected in recorded["forward"].items():
        actual = today["forward"][law]
        assert actual["shape"] == expected["shape"], law
        assert_close(
            actual["first"] + actual["last"] + [actual["abs_sum"]],
            expected["first"] + expected["last"] + [expected["abs_sum"]],
            law,
        )
        assert abs(actual["sum"] - expected["sum"]) <= RTOL * expected["abs_sum"], law
    assert_close(today["loc_Y"], recorded["loc_Y"], "loc_Y")
    assert_close(today["loss"], recorded["loss"], "loss")


def test_the_literal_loss_equals_the_recorded_default_loss(loaded):
    """The saved loss_algorithm is the fused one; the literal formula gives the same mean to float32 rounding."""
    _, recorded, found = loaded
    np.testing.assert_allclose(part(found, "today_only")["literal_loss"], recorded["loss"], rtol=1e-5, atol=0)


@pytest.mark.parametrize("loader", ["auto", "causalqwen"])
@pytest.mark.parametrize("options", ["greedy", "numbers"])
def test_generate_gives_the_recorded_ids_and_values(loaded, loader, options):
    _, recorded, found = loaded
    actual, expected = part(found, loader)["generate"][options], recorded["generate"][options]
    assert actual["sequences"] == expected["sequences"]
    assert_close_values(actual["numeric_values"], expected["numeric_values"], "numeric_values")


@pytest.mark.parametrize("loader", ["auto", "causalqwen"])
def test_the_pipeline_writes_the_recorded_text(loaded, loader):
    """As it comes (no number generated) the text is the recorded one. With every step a number, the default
    writing changed after both directories were written (D17: at the prompt's resolution, where the recorded text
    has every float32 digit): today's text is the recorded values written that way, and number_resolution=None
    gives the recorded text exactly."""
    _, recorded, found = loaded
    generate = part(found, loader)["generate"]
    assert generate["greedy"]["pipeline_text"] == recorded["generate"]["greedy"]["pipeline_text"]
    new_tokens = recorded["generate"]["max_new_tokens"]
    num = recorded["config"]["num_token_id"]
    assert recorded["generate"]["numbers"]["sequences"][-new_tokens:] == [num] * new_tokens
    generated = recorded["generate"]["numbers"]["numeric_values"][-new_tokens:]
    expected = recorded["generate"]["prompt"] + "".join(" " + written_at_prompt_resolution(v) for v in generated)
    assert generate["numbers"]["pipeline_text"] == expected
    if loader == "causalqwen":
        every_digit = part(found, "today_only")["every_digit_text"]
        assert_same_text_close_numbers(every_digit, recorded["generate"]["numbers"]["pipeline_text"])


def run_fresh(arguments: list[str], work: Path) -> subprocess.CompletedProcess:
    environment = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_MODULES_CACHE=str(work / "modules"),
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
    )
    return subprocess.run(
        [sys.executable, "-c", *arguments],
        check=False,
        cwd=work,
        env=environment,
        capture_output=True,
        text=True,
        timeout=budget(600),
    )


def test_a_directory_saved_today_imports_the_top_level_namespace_and_loads_the_same_both_ways(tmp_path):
    from causalqwen.app.tiny import build_tiny_causal_lm

    tiny = build_tiny_causal_lm(seed=1, init_seed=1)
    saved = tmp_path / "saved"
    tiny.model.save_pretrained(saved)
    tiny.tokenizer.save_pretrained(saved)
    module = ast.parse((saved / "causalqwen_auto.py").read_text(encoding="utf-8"))
    imports = [node for node in ast.walk(module) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports and all(
        isinstance(node, ast.ImportFrom) and node.module == "causalqwen" and node.level == 0 for node in imports
    ), ast.unparse(module)
    out = tmp_path / "found.json"
    result = run_fresh([LOAD, str(SAVED / "record.py"), str(saved), str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(out.read_text(encoding="utf-8"))
    assert part(found, "auto") == part(found, "causalqwen")
    assert part(found, "auto")["config"]["abduction_scale_init"] == tiny.model.config.abduction_scale_init


# A directory whose causalqwen_auto.py names what no version had: the import fails and its message names it.
UNKNOWN_IMPORTS = {
    "from causalqwen.no_such_module import CausalQwenConfig": "causalqwen.no_such_module",
    "from causalqwen.pipelines import NoSuchPipeline": "NoSuchPipeline",
    "from causalqwen.tokenization import NoSuchTokenizer": "NoSuchTokenizer",
}

# one directory per interpreter: after a failed import of one directory's module, transformers' AutoConfig in the
# same interpreter can answer another directory's without importing it
LOAD_CONFIG = r"""
import json, sys
from transformers import AutoConfig

try:
    AutoConfig.from_pretrained(sys.argv[2], trust_remote_code=True)
    error = None
except Exception as raised:
    error = [[kind.__name__ for kind in type(raised).__mro__], str(raised)]
open(sys.argv[1], "w", encoding="utf-8").write(json.dumps(error))
"""


@pytest.mark.parametrize("line", list(UNKNOWN_IMPORTS))
def test_an_old_directory_importing_an_unknown_module_or_name_fails_with_its_name(tmp_path, line):
    directory = tmp_path / "saved"
    shutil.copytree(SAVED / "main_41679d3", directory)
    auto = directory / "causalqwen_auto.py"
    auto.write_text(auto.read_text(encoding="utf-8") + line + "  # noqa: F401\n", encoding="utf-8")
    out = tmp_path / "error.json"
    result = run_fresh([LOAD_CONFIG, str(out), str(directory)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    error = json.loads(out.read_text(encoding="utf-8"))
    assert error is not None, line
    kinds, message = error
    assert "ImportError" in kinds and UNKNOWN_IMPORTS[line] in message, (kinds, message)
