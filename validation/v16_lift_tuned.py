r"""LIFT at each arm's tuned best: every language model fine-tuned with all weights, on the answer alone

**Question.** V14 pairs the language models at one matched budget (backbone frozen, 200 steps, one learning
rate, the loss on every token of the text, the input's number included), and there CausalQwen scores about the RAE
of predicting the mean. Is that the design, or the protocol? Here every arm gets its tuned best on the same LIFT
data (`validation.lift_data`: six functions of one input, clean and with 4 outliers, 3 simulations), and V14's
matched pairing stays as the second table, on [its own page](v14.md).

**Protocol, the same for every language-model arm** (all start from the same pretrained tiny Qwen2,
`validation.domains`):

- *the answer alone is trained*: a row is LIFT's prompt and its answer (`causalqwen.files.data.PromptCompletion`;
  for Qwen the prompt's labels are -100, `validation.qwen_finetuning.finetune_qwen` with ``prompts``), so both of
  CausalQwen's losses and Qwen's cross-entropy score the answer's tokens alone;
- *all weights trainable*: CausalQwen preset ``all``, Qwen variant ``all`` (the backbone, its embeddings and the
  head);
- *the learning rate chosen per arm and function* from the grid `LEARNING_RATES`, by the RAE on LIFT's validation
  split (50 noisy points that neither training nor the test set holds) of simulation 1 with outliers (the condition
  the goals are stated in), then used for every condition and simulation of that function;
- *steps to a flat loss*: `STEPS` for every arm (batch 16, 10% warm-up then cosine decay); the page shows the
  training-loss curves, and the flatness ratio, the mean loss over the last 10% of steps over the mean of the 10%
  before, for every run;
- *answers*: CausalQwen's $\mathrm{loc}_Y$ read at the prompt's last token (`causalqwen.regression.next_number_law`,
  standard mode); Qwen's greedy continuation read by the number grammar, an unparseable answer replaced by the mean
  of the training targets (LIFT's own rule).

**Intervals.** CausalQwen also predicts a law, so its central intervals are scored where the answers are noisy
observations, as the law is about: LIFT's validation split (the test targets are noiseless), each data set's 50
points halved. On the second halves the raw central Cauchy intervals' coverage, and the coverage after split-conformal
factors fitted on the first halves (`causalqwen.regression.conformal_factors`, beyond the design).

| arm | reads $x$ as | answers with |
|---|---|---|
| CausalQwen | one ``<NUM>`` with its value | $\mathrm{loc}_Y$, the location of the Cauchy law of the next number |
| Qwen digits | digit tokens | its greedy continuation, parsed |
| Qwen digits + NTL | digit tokens | the same, trained with cross-entropy $+\ 0.3\,\mathcal L_{\mathrm{NTL}}$ (`ntloss`, as V11) |

The tabular baselines are V14's (`validation.lift_baselines`), re-run on the same data; the published LIFT/GPT-J
and LIFT/GPT-3 rows are quoted, not re-run. **Metric**: LIFT RAE (LIFT's definition, after its 3-RMSE filter)
wherever a published number is compared, RAE otherwise; 1 is the score of predicting the test mean.

**Goals** (measured, not claims): with outliers, CausalQwen's LIFT RAE below the published LIFT/GPT-J on at least
4 of the 6 functions, and its RAE below Qwen digits' on all 12 (function, condition) cells; moonshot: with outliers,
within 2× of the robust polynomial (the better of Huber and Cauchy) on linear, quadratic and exponential.
"""  # noqa: E501

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from pathlib import Path

import numpy as np
import torch

from .common import ExperimentResult, fmt, module_text
from .lift_baselines import CLASSICAL, QUICK_METHODS, ROBUST
from .lift_data import CONDITIONS, FUNCTIONS, LiftData, generate, prompt_text, rae, training_text
from .v14_report import chosen_settings, save_predictions
from .v16_report import flatness, report_body, report_claims, report_headline, tuned_figure

__all__ = ["LEARNING_RATES", "STEPS", "run", "train_arm", "flatness"]

ARMS = ("CausalQwen", "Qwen digits", "Qwen digits + NTL")
# CausalQwen's arms by the conversion settings they add (`causalqwen.embedding`: the number encodings, V17)
BINARY_PERIODS = tuple(2.0**j for j in range(-3, 7))
CAUSAL_ARMS = {
    "CausalQwen": {},
    "CausalQwen, log_fourier 10^j": {"number_encoding": "log_fourier"},
    "CausalQwen, log_fourier 2^j": {"number_encoding": "log_fourier", "number_periods": list(BINARY_PERIODS)},
}
LEARNING_RATES = (3e-4, 1e-3, 3e-3)
STEPS = 800
BATCH = 16
SEED = 0
LOG_EVERY = 10  # CausalQwen's training loss is logged every LOG_EVERY steps (Qwen's every step)
MAX_NEW_TOKENS = 12  # the longest answer, "-123.456@", is 9 tokens of the tiny tokenizer
FULL = {
    "arms": ARMS,
    "functions": FUNCTIONS,
    "conditions": CONDITIONS,
    "sims": (1, 2, 3),
    "learning_rates": LEARNING_RATES,
    "steps": STEPS,
    "methods": CLASSICAL + ROBUST,
    "workers": 2,
}
QUICK = {
    "arms": ARMS,
    "functions": ("linear",),
    "conditions": ("outliers",),
    "sims": (1,),
    "learning_rates": (3e-3,),
    "steps": 20,
    "methods": QUICK_METHODS,
    "workers": 1,
}
SELECTION = ("outliers", 1)  # the condition and simulation whose validation split chooses the learning rate

_STARTING_POINT = None  # each worker process's pretrained base and tokenizers (`_start_worker`)


def _start_worker() -> None:
    """One torch thread and the pretrained starting point, once per worker process."""
    global _STARTING_POINT
    from transformers.utils import logging as transformers_logging

    from .domains import pretrained_starting_point

    torch.set_num_threads(1)
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    _STARTING_POINT = pretrained_starting_point()


def _completion(x: float, y: float) -> str:
    return training_text(x, y)[len(prompt_text(x)) :]


def _causal_run(data: LiftData, learning_rate: float, steps: int, init: dict) -> dict:
    from causalqwen.app.training_run import train
    from causalqwen.files.data import PromptCompletion, TextDataset
    from causalqwen.regression import next_number_law
    from causalqwen.training import TrainingConfig

    from .v9_comparison import causal_model

    base, _, tokenizer = _STARTING_POINT
    model = causal_model(base, tokenizer, seed=SEED, **init)
    rows = [PromptCompletion(prompt_text(x), _completion(x, y)) for x, y in zip(data.x_train, data.y_train)]
    config = TrainingConfig(
        steps=steps,
        batch_size=BATCH,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 10),
        preset="all",
        log_every=LOG_EVERY,
        eval_every=10**9,
        save_every=10**9,
        seed=SEED,
    )
    history = train(model, TextDataset(rows, tokenizer, max_length=64), config, progress=False)
    model.eval()

    def laws(x_values) -> tuple[np.ndarray, np.ndarray]:
        encoding = tokenizer([prompt_text(x) for x in x_values], padding=True, return_tensors="pt")
        law = next_number_law(model, encoding["input_ids"], encoding["numeric_values"], encoding["attention_mask"])
        return law.loc.double().numpy(), law.scale.double().numpy()

    (valid, valid_scale), (predicted, scale) = laws(data.x_valid), laws(data.x_test)
    return {
        "valid": valid,
        "valid_scale": valid_scale,
        "predicted": predicted,
        "scale": scale,
        "unparseable": 0,
        "losses": [record["train/total_loss"] for record in history if "train/total_loss" in record],
        "steps": max(record["step"] for record in history),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _qwen_run(data: LiftData, learning_rate: float, steps: int, ntl: bool) -> dict:
    from .comparison_eval import greedy_numbers, token_texts_of
    from .qwen_finetuning import finetune_qwen
    from .v11_arithmetic import NumberTokenLossTerm

    base, tokenizer, _ = _STARTING_POINT
    prompts = [prompt_text(x) for x in data.x_train]
    texts = [training_text(x, y) for x, y in zip(data.x_train, data.y_train)]
    term = NumberTokenLossTerm(tokenizer, base.config.vocab_size) if ntl else None
    model, trainable = finetune_qwen(
        base,
        tokenizer,
        texts,
        "all",
        steps=steps,
        batch_size=BATCH,
        learning_rate=learning_rate,
        seed=SEED,
        extra_loss=term,
        prompts=prompts,
    )
    token_texts = token_texts_of(tokenizer, model.config.vocab_size)
    mean = float(np.mean(data.y_train))

    def answers(x_values) -> tuple[np.ndarray, int]:
        written = greedy_numbers(model, tokenizer, [prompt_text(x) for x in x_values], MAX_NEW_TOKENS, 100, token_texts)
        written = np.asarray(written, dtype=np.float64)
        unparseable = ~np.isfinite(written)
        return np.where(unparseable, mean, written), int(unparseable.sum())

    valid, _ = answers(data.x_valid)
    predicted, unparseable = answers(data.x_test)
    return {
        "valid": valid,
        "predicted": predicted,
        "unparseable": unparseable,
        "losses": list(model.train_losses),
        "steps": len(model.train_losses),
        "trainable": trainable,
        "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        "ntl_finite": bool(np.isfinite(term.values).all()) if term else None,
    }


def train_arm(arm: str, function: str, condition: str, sim: int, learning_rate: float, steps: int) -> dict:
    """One language-model arm trained on one LIFT data set (in a worker process started by `_start_worker`): its
    answers on the validation and test splits, training losses, steps, trainable values and seconds."""
    if arm not in ARMS + tuple(CAUSAL_ARMS):
        raise ValueError(f"arm must be one of {', '.join(ARMS + tuple(CAUSAL_ARMS))}, got {arm!r}")
    clock = time.perf_counter()
    data = generate(function, sim, condition)
    if arm in CAUSAL_ARMS:
        result = _causal_run(data, learning_rate, steps, CAUSAL_ARMS[arm])
    else:
        result = _qwen_run(data, learning_rate, steps, ntl=arm.endswith("NTL"))
    return result | {"learning_rate": learning_rate, "seconds": time.perf_counter() - clock}


def _baselines(datasets, methods):
    from .lift_baselines import baseline_predictions

    return baseline_predictions(datasets, methods)


def _selection(pool, settings: dict) -> tuple[dict, dict]:
    """``(chosen, grid)``: each arm's learning rate per function, and every selection run by (arm, function, rate)."""
    condition, sim = SELECTION if SELECTION[0] in settings["conditions"] else (settings["conditions"][0], 1)
    pending = {
        (arm, function, rate): pool.submit(train_arm, arm, function, condition, sim, rate, settings["steps"])
        for arm in settings["arms"]
        for function in settings["functions"]
        for rate in settings["learning_rates"]
    }
    grid = {key: future.result() for key, future in pending.items()}
    chosen = {}
    for arm in settings["arms"]:
        for function in settings["functions"]:
            valid_y = generate(function, sim, condition).y_valid
            scores = {rate: rae(grid[(arm, function, rate)]["valid"], valid_y) for rate in settings["learning_rates"]}
            chosen[(arm, function)] = min(scores, key=scores.get)
    return chosen, {key: run | {"selection": (condition, sim)} for key, run in grid.items()}


def _final_runs(pool, settings: dict, chosen: dict, grid: dict) -> dict:
    """``{arm: {data key: run}}`` at the chosen rates, the selection runs reused where they are the same run."""
    selected = SELECTION if SELECTION[0] in settings["conditions"] else (settings["conditions"][0], 1)
    pending, runs = {}, {arm: {} for arm in settings["arms"]}
    for arm in settings["arms"]:
        for function in settings["functions"]:
            rate = chosen[(arm, function)]
            for condition in settings["conditions"]:
                for sim in settings["sims"]:
                    key = (function, condition, sim)
                    if (condition, sim) == selected:
                        runs[arm][key] = grid[(arm, function, rate)]
                    else:
                        pending[(arm, key)] = pool.submit(
                            train_arm, arm, function, condition, sim, rate, settings["steps"]
                        )
    for (arm, key), future in pending.items():
        runs[arm][key] = future.result()
    return runs


def measure(settings: dict) -> dict:
    """Every run of the study for ``settings`` (`FULL`, `QUICK` or a choice of functions, conditions, simulations,
    rates, steps, methods and worker processes): the dict the report reads."""
    started = time.perf_counter()
    datasets = [
        generate(function, sim, condition)
        for condition in settings["conditions"]
        for function in settings["functions"]
        for sim in settings["sims"]
    ]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=settings["workers"], mp_context=context, initializer=_start_worker
    ) as pool:
        baselines = pool.submit(_baselines, datasets, settings["methods"])
        chosen, grid = _selection(pool, settings)
        runs = _final_runs(pool, settings, chosen, grid)
        baselines = baselines.result()
    return {
        "datasets": datasets,
        "settings": settings,
        "chosen": chosen,
        "grid": grid,
        "runs": runs,
        "baselines": baselines,
        "elapsed": time.perf_counter() - started,
    }


def run(quick: bool, out_dir: Path, **choices) -> ExperimentResult:
    """The study (`FULL`, or `QUICK`), with any setting replaced by ``choices`` (``functions=("cosine",)``)."""
    settings = chosen_settings(QUICK if quick else FULL, choices)
    measured = measure(settings)
    out_dir = Path(out_dir)
    save_predictions(measured, out_dir / "v16_predictions.json")
    title, text = module_text(__name__)
    return ExperimentResult(
        name="V16",
        title=title,
        claims=report_claims(measured),
        body=report_body(text, measured),
        figures=[tuned_figure(measured, out_dir)],
        headline=report_headline(measured),
        settings=(
            f"{settings['steps']} steps for every language-model arm, batch {BATCH}, seed {SEED}; learning rates "
            f"{', '.join(fmt(r) for r in settings['learning_rates'])} (chosen per arm and function on the "
            f"validation split); functions {', '.join(settings['functions'])}; conditions "
            f"{', '.join(settings['conditions'])}; simulations {', '.join(map(str, settings['sims']))}; baselines "
            f"{', '.join(settings['methods'])}; {settings['workers']} worker process(es) of one torch thread; raw "
            "answers in v16_predictions.json beside this page"
        ),
    )
