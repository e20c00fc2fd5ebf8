r"""lm-eval: Qwen beside CausalQwen on numbers

**Question.** Read by EleutherAI's lm-evaluation-harness through its own adapter
(`causalqwen.app.lm_eval_adapter`, the model ``causalqwen``: every number of a text reaches the model as
``<NUM>`` with its value, and is scored as the probability of its written resolution interval,
`causalqwen.likelihood`), does CausalQwen pick the right number in the multiple-choice items at least 3 times in 4
(the goal)? And what does lm-eval's ordinary ``--model hf`` report when it is pointed at the same trained
directory, as a user who does not know about the adapter would do?

**Method.** The offline task group ``cq_numbers`` (`validation/lm_eval_tasks`, run from the repository root):
``cq_numbers_mc``, 8 multiple-choice items whose choices are numbers in the sentence frames of the demo's
synthetic data (*acc*: the choice of highest log-likelihood is right; *acc_norm*: the same, log-likelihood per
byte); ``cq_numbers_rolling``, 8 short paragraphs scored in *bits per byte* (lower is better; both kinds of model
give a probability of the same bytes, so the figures compare); ``cq_numbers_gen``, 6 prompts continued greedily up
to a line break, *exact match* of the first number written. Each row is one ``lm_eval.simple_evaluate`` on the
CPU, zero-shot, batch size 4, and every model comes from the same tiny Qwen2 base
(`causalqwen.app.tiny.save_tiny_base`, seed 0), saved to a temporary directory:

| row | model | read by | numbers reach the model as |
|---|---|---|---|
| a | the Qwen2 base | ``--model hf`` (HFLM, ``dtype=float32``) | digit tokens |
| b | CausalQwen converted from it, untrained | ``causalqwen`` (``pretrained=`` the base directory: converted on load) | ``<NUM>`` and its value |
| c | CausalQwen after the demo's training (`causalqwen.app.demo.run_demo`, seed 0, into a temporary directory) | ``causalqwen`` | ``<NUM>`` and its value |
| d | **the trap**: c's directory | ``--model hf`` (HFLM, ``trust_remote_code=True``) with the plain wrapped tokenizer (the Qwen2 tokenizer inside CausalQwen's, ``<NUM>`` added) | digit tokens the model never trained on |

Two controls go with the trap. *d, as typed*: c's directory read by the command line a user would type,
``--model hf --model_args pretrained=DIR,dtype=float32,trust_remote_code=True``, where HFLM loads the tokenizer the
directory names (CausalQwen's own); whatever happens is reported, a failure as its error text. *d₀*: b's model
saved as a directory and read like d. Under HFLM a CausalQwen model is a Qwen2 with ``logits`` = $\mathrm{loc}_S$,
which equal Qwen's logits at initialization (decision D7), so d₀ must score as row a: the trap measures the Qwen2
backbone on digits, not CausalQwen.

**Claims.** The trained CausalQwen's mc acc is at least 0.75 (the goal); the trap's mc acc is at most 0.25, or it
fails to load; d₀ scores as a. The items were written before this study and are not tuned to it: a claim that
fails, fails.
"""  # noqa: E501

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from pathlib import Path

from causalqwen.app.commands import load_model_and_tokenizer
from causalqwen.app.demo import DEMO_STEPS, run_demo
from causalqwen.app.tiny import save_tiny_base

from .common import Claim, ExperimentResult, check, fmt, module_text, table

SEED = 0
QUICK_STEPS = 300
BATCH_SIZE = 4
TASK_GROUP = "cq_numbers"
TASKS_DIR = "validation/lm_eval_tasks"  # relative: the tasks' data paths are read from the repository root
ROOT = Path(__file__).resolve().parent.parent
GOAL_ACC = 0.75  # the goal: right at least 3 times in 4
TRAP_ACC = 0.25  # at most chance (four choices)
SAME_TOLERANCE = 1e-6  # d0 against a: the same numbers up to float noise
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# (column, task, lm-eval's metric key, higher is better)
COLUMNS = (
    ("mc acc", "cq_numbers_mc", "acc,none", True),
    ("mc acc_norm", "cq_numbers_mc", "acc_norm,none", True),
    ("rolling bits_per_byte", "cq_numbers_rolling", "bits_per_byte,none", False),
    ("gen exact_match", "cq_numbers_gen", "exact_match,first_number", True),
)
ROWS = {
    "a": "Qwen2 base · `--model hf`",
    "b": "CausalQwen, untrained (converted on load) · `causalqwen`",
    "c": "CausalQwen, trained (demo) · `causalqwen`",
    "d": "the trap: trained CausalQwen dir · `--model hf`, plain wrapped tokenizer",
    "d as typed": "control: trained CausalQwen dir · `--model hf`, `trust_remote_code=True`, the dir's tokenizer",
    "d₀": "control: untrained CausalQwen dir · `--model hf`, plain wrapped tokenizer",
}
COMPARED = ("a", "b", "c", "d")  # the rows that compete in the who-wins sentence


# ---------------------------------------------------------------------------------------------
# One reading of the task group
# ---------------------------------------------------------------------------------------------


def evaluate(model, model_args: str | None = None) -> dict:
    """``cq_numbers`` read by ``model`` (an lm-eval ``LM``, or a registered name with ``model_args``):
    ``metrics`` (column → value), ``picks`` (the chosen index of every mc item), ``generated`` (the first
    number of every generation, as lm-eval's filter read it) and ``seconds``."""
    # lm_eval.models registers "hf": lm-eval looks its models up lazily only while its registry is empty,
    # and importing causalqwen's adapter has put "causalqwen" there
    import lm_eval
    import lm_eval.models
    from lm_eval.tasks import TaskManager

    begin = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[TASK_GROUP],
        task_manager=TaskManager(include_path=TASKS_DIR),
        device="cpu",
        batch_size=BATCH_SIZE,
        log_samples=True,
    )
    results, samples = out["results"], out["samples"]
    metrics = {column: float(results[task][key]) for column, task, key, _ in COLUMNS}
    picks = [
        max(range(len(s["filtered_resps"])), key=lambda i, s=s: s["filtered_resps"][i][0])
        for s in sorted(samples["cq_numbers_mc"], key=lambda s: s["doc_id"])
    ]
    generated = [s["filtered_resps"][0] for s in sorted(samples["cq_numbers_gen"], key=lambda s: s["doc_id"])]
    return {
        "metrics": metrics,
        "picks": picks,
        "generated": generated,
        "seconds": time.perf_counter() - begin,
        "error": None,
    }


def failed(error: BaseException, begin: float) -> dict:
    """A reading that raised: its error text (first line) instead of numbers."""
    text = (str(error).splitlines() or [""])[0]
    return {
        "metrics": {column: math.nan for column, *_ in COLUMNS},
        "picks": None,
        "generated": None,
        "seconds": time.perf_counter() - begin,
        "error": f"{type(error).__name__}: {text}",
    }


def hf_reading(directory: Path, tokenizer=None) -> dict:
    """``directory`` read by HFLM with ``trust_remote_code=True``: with ``tokenizer`` (an object), or, with None,
    by the command line's ``--model hf --model_args pretrained=DIR,...`` (the tokenizer the directory names).
    An error (at load or at any request) is the reading's result."""
    begin = time.perf_counter()
    try:
        if tokenizer is None:
            return evaluate("hf", f"pretrained={directory},dtype=float32,trust_remote_code=True")
        from lm_eval.models.huggingface import HFLM

        model = HFLM(
            pretrained=str(directory),
            tokenizer=tokenizer,
            trust_remote_code=True,
            dtype="float32",
            device="cpu",
            batch_size=BATCH_SIZE,
        )
        return evaluate(model)
    except Exception as error:  # noqa: BLE001 -- the trap may fail to load or to score; that is a result
        return failed(error, begin)


def adapter_reading(pretrained: Path) -> dict:
    """``pretrained`` read by the ``causalqwen`` model (`CausalQwenLM`, its defaults: standard mode, OvR)."""
    from causalqwen.app.lm_eval_adapter import CausalQwenLM

    return evaluate(CausalQwenLM.create_from_arg_string(f"pretrained={pretrained},mode=standard"))


def save_untrained(base_dir: Path, out_dir: Path) -> Path:
    """The conversion the adapter makes of ``base_dir`` (`load_model_and_tokenizer`, seed 0), saved to ``out_dir``."""
    model, tokenizer = load_model_and_tokenizer(str(base_dir), seed=SEED)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def all_readings(work: Path, steps: int) -> dict:
    """Every row's reading, and the demo's exit code and training time, with models written under ``work``."""
    base = Path(save_tiny_base(work / "qwen2_base", seed=SEED))
    readings = {"a": evaluate("hf", f"pretrained={base},dtype=float32"), "b": adapter_reading(base)}
    begin = time.perf_counter()
    with contextlib.redirect_stdout(None):  # the demo's own report; its exit code is kept
        demo_exit = run_demo(str(work / "demo"), steps=steps, seed=SEED, progress=False)
    training_seconds = time.perf_counter() - begin
    trained = work / "demo" / "model"
    readings["c"] = adapter_reading(trained)
    _, trained_tokenizer = load_model_and_tokenizer(str(trained))
    readings["d"] = hf_reading(trained, trained_tokenizer.hf_tokenizer)
    readings["d as typed"] = hf_reading(trained)
    untrained = save_untrained(base, work / "untrained")
    _, untrained_tokenizer = load_model_and_tokenizer(str(untrained))
    readings["d₀"] = hf_reading(untrained, untrained_tokenizer.hf_tokenizer)
    return {"readings": readings, "demo_exit": demo_exit, "training_seconds": training_seconds}


# ---------------------------------------------------------------------------------------------
# Tables and sentences
# ---------------------------------------------------------------------------------------------


def main_rows(readings: dict) -> list[list]:
    """One row per reading: the four columns, or the error text across them."""
    rows = []
    for name, label in ROWS.items():
        reading = readings[name]
        if reading["error"] is not None:
            rows.append([name, label, f"failed: `{reading['error']}`", "", "", "", reading["seconds"]])
        else:
            rows.append([name, label, *(reading["metrics"][column] for column, *_ in COLUMNS), reading["seconds"]])
    return rows


def who_wins(readings: dict) -> list[str]:
    """Per column, the best of rows a-d (ties named together; a row that failed takes no part)."""
    sentences = []
    for column, _, _, higher in COLUMNS:
        values = {name: readings[name]["metrics"][column] for name in COMPARED if readings[name]["error"] is None}
        best = max(values.values()) if higher else min(values.values())
        leaders = [name for name, value in values.items() if value == best]
        listing = ", ".join(f"{name} {fmt(value, 4)}" for name, value in values.items())
        direction = "higher" if higher else "lower"
        if len(leaders) == len(values):
            sentences.append(f"- **{column}** ({direction} is better): all rows tie ({listing}).")
        else:
            who = " and ".join(f"{name} ({ROWS[name].split(' · ')[0]})" for name in leaders)
            sentences.append(
                f"- **{column}** ({direction} is better): {who} {'win' if len(leaders) > 1 else 'wins'} ({listing})."
            )
    return sentences


def item_rows(readings: dict, root: Path) -> tuple[list[list], list[list], list[str]]:
    """The mc items (gold choice and every row's pick, ✓ when right), the generations (every row's number), and
    the rows that ran (a failed row has no picks)."""
    import json

    names = [name for name in ROWS if readings[name]["error"] is None]
    mc = [json.loads(line) for line in (root / TASKS_DIR / "numbers_mc.jsonl").read_text().splitlines() if line]
    gen = [json.loads(line) for line in (root / TASKS_DIR / "numbers_gen.jsonl").read_text().splitlines() if line]
    mc_rows, gen_rows = [], []
    for k, item in enumerate(mc):
        picks = [
            item["choices"][readings[n]["picks"][k]].strip() + (" ✓" if readings[n]["picks"][k] == item["gold"] else "")
            for n in names
        ]
        mc_rows.append([item["context"], item["choices"][item["gold"]].strip(), *picks])
    for k, item in enumerate(gen):
        gen_rows.append([item["prompt"], item["answer"], *(f"`{readings[n]['generated'][k]}`" for n in names)])
    return mc_rows, gen_rows, names


def largest_difference(readings: dict, first: str, second: str) -> float:
    """The largest |difference| between two readings over the four columns (NaN if either failed)."""
    differences = [abs(readings[first]["metrics"][c] - readings[second]["metrics"][c]) for c, *_ in COLUMNS]
    return math.nan if any(math.isnan(d) for d in differences) else max(differences)


def claims(readings: dict) -> list[Claim]:
    trap = readings["d"]
    trap_acc = trap["metrics"]["mc acc"]
    return [
        check(
            "the trained CausalQwen read by the adapter (row c): mc acc (the goal: right at least 3 times in 4)",
            readings["c"]["metrics"]["mc acc"],
            ">=",
            GOAL_ACC,
        ),
        Claim(
            "the trap (row d, c's directory read by `--model hf`): mc acc at most 0.25, or it failed to load",
            trap_acc,
            f"≤ {fmt(TRAP_ACC)} or a failure",
            trap["error"] is not None or trap_acc <= TRAP_ACC,
        ),
        check(
            "control d₀ (the untrained CausalQwen read by `--model hf`) scores as its Qwen2 base (row a): the "
            "largest |difference| over the four columns",
            largest_difference(readings, "d₀", "a"),
            "<=",
            SAME_TOLERANCE,
        ),
    ]


def trap_text(readings: dict) -> str:
    """What the trap rows say, in words, from the measured numbers."""
    d, typed = readings["d"], readings["d as typed"]
    parts = ["**The trap.**"]
    if d["error"] is None:
        parts.append(
            f"Read by `--model hf` with the plain wrapped tokenizer, the trained model gets mc acc "
            f"{fmt(d['metrics']['mc acc'], 4)} where the adapter gets {fmt(readings['c']['metrics']['mc acc'], 4)}: "
            "HFLM sends the digits as digit tokens, which the demo never trained on (it saw every number as "
            "`<NUM>`), and passes ids only, no values."
        )
    else:
        parts.append(
            f"Read by `--model hf` with the plain wrapped tokenizer, the trained model failed: `{d['error']}`."
        )
    if typed["error"] is None:
        parts.append(
            f"As typed on the command line (the directory's own tokenizer) it loaded and scored mc acc "
            f"{fmt(typed['metrics']['mc acc'], 4)}."
        )
    else:
        parts.append(
            f"As typed on the command line (`trust_remote_code=True`, so HFLM loads the tokenizer the "
            f"directory names, CausalQwen's own) it did not run to the end: `{typed['error']}`."
        )
    difference = largest_difference(readings, "d₀", "a")
    parts.append(
        f"The untrained conversion read the same way (d₀) differs from the Qwen2 base (a) by at most "
        f"{fmt(difference, 3)} in any column: under `--model hf` a CausalQwen directory is scored as its "
        "Qwen2 backbone."
    )
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# The study
# ---------------------------------------------------------------------------------------------


def body(text: str, measured: dict) -> str:
    readings = measured["readings"]
    mc_rows, gen_rows, names = item_rows(readings, ROOT)
    return "\n\n".join(
        [
            text,
            "**Results** (`cq_numbers`, one `simple_evaluate` per row; the last column is that row's wall time):",
            table(["row", "model · read by", *(column for column, *_ in COLUMNS), "seconds"], main_rows(readings)),
            "**Who wins**, per column, among rows a–d:",
            "\n".join(who_wins(readings)),
            trap_text(readings),
            "**The multiple-choice items**: the right choice and every row's pick (✓: right):",
            table(["context", "right", *names], mc_rows),
            "**The generations**: the first number each row wrote (lm-eval's filter; `[no number]`: none):",
            table(["prompt", "answer", *names], gen_rows),
            (
                f"The demo's training ({measured['steps']} steps, seed {SEED}) took "
                f"{fmt(measured['training_seconds'], 3)} s "
                f"and exited with {measured['demo_exit']} (0: it met its own goals); the whole study "
                f"{fmt(measured['elapsed'], 3)} s."
            ),
        ]
    )


def headline(readings: dict) -> str:
    def acc(name: str) -> str:
        reading = readings[name]
        return "failed" if reading["error"] is not None else fmt(reading["metrics"]["mc acc"], 3)

    goal = readings["c"]["metrics"]["mc acc"] >= GOAL_ACC
    return (
        f"mc acc: Qwen2 hf {acc('a')}, CausalQwen untrained {acc('b')}, trained {acc('c')} "
        f"(goal ≥ {fmt(GOAL_ACC)} {'met' if goal else 'not met'}), the trap (trained, `--model hf`) {acc('d')}"
    )


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    import lm_eval

    steps = QUICK_STEPS if quick else DEMO_STEPS
    started = time.perf_counter()
    for name in OFFLINE:
        os.environ[name] = "1"
    with tempfile.TemporaryDirectory(prefix="v12_") as work, contextlib.chdir(ROOT):
        measured = all_readings(Path(work), steps)
    measured.update(steps=steps, elapsed=time.perf_counter() - started)
    title, text = module_text(__name__)
    return ExperimentResult(
        name="V12",
        title=title,
        claims=claims(measured["readings"]),
        body=body(text, measured),
        headline=headline(measured["readings"]),
        settings=(
            f"tiny Qwen2 base seed {SEED}; demo training {steps} steps, seed {SEED}; lm-eval "
            f"{lm_eval.__version__}, zero-shot, batch size {BATCH_SIZE}, CPU; the adapter at its defaults "
            "(standard mode, normalised OvR, numbers at their written resolution)"
        ),
    )
