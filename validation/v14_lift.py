r"""An outside benchmark with published tables: LIFT's regression from text, clean and with outliers

**Question.** On data somebody else generated and against numbers somebody else published, does reading a number
as a value (``<NUM>``) and predicting a Cauchy law for the answer do better than writing digits? The benchmark is
LIFT (Dinh et al., "LIFT: Language-Interfaced Fine-Tuning for Non-Language Machine Learning Tasks", NeurIPS 2022;
repository UW-Madison-Lee-Lab/LanguageInterfacedFineTuning): fit $y = f(x)$ from 200 sentences, six functions of
one input, clean and with 4 outliers in the training set, 3 simulations each.

**Data**, generated offline by `validation.lift_data` from LIFT's published recipe (its docstring has the recipe;
the code was read and rewritten, not copied). **How it was checked:** the recipe's test inputs are those of LIFT's
shipped test files (the first test point is $x = -5.8350$, as in ``regression/accuracy/data_1``; checked while
writing it), and the reproduced classical baselines must land near LIFT's published column: the degree-3
polynomial, which has no tuning and no randomness, is the claim below (tolerance $0.005 + 5\%$ of the published
value per function and condition, for the spread between LIFT's unseeded splits and ours); the six tuned
baselines are shown beside their published values. Each example is LIFT's text, with a line break after "###"
(the project's number grammar reads no number right after "#", an issue number; the line break also makes Qwen2's
tokenizer end the prompt with the same token whatever the answer's sign, checked below). So the text is
"When we have x1=-5.8350, what should be the y value?###" + line break + "-5.252@@@"; "x1" stays text (the grammar
reads no number inside a word).

**Arms.** All language-model arms start from the same pretrained tiny Qwen2 (`validation.domains`), are trained on
the same 200 (or 204) texts of each data set, with the same steps, batch, learning rate, warm-up and schedule,
backbone frozen, trainable budgets equal within 1% (the V9 pairing):

| arm | reads $x$ as | answers with | trainable |
|---|---|---|---|
| CausalQwen | one ``<NUM>`` with its value | $\mathrm{loc}_Y$ at the position before the answer's ``<NUM>`` (standard mode) | preset `causal` |
| Qwen digits | digit tokens | its greedy continuation of the prompt, read by the number grammar | variant `head` |
| Qwen digits + NTL | digit tokens | the same; trained with cross-entropy $+\ 0.3\,\mathcal L_{\mathrm{NTL}}$ (`ntloss`, as V11) | variant `head` |

An answer of a digit arm that holds no number is *unparseable*; as in LIFT's own scoring (``save_csv``) it is
replaced by the mean of the training targets, and the unparseable share is reported. The tabular baselines
(`validation.lift_baselines`): LIFT's seven classical ones with LIFT's published tuning, and robust ones (Huber and
Cauchy-likelihood polynomials, causal-sklearn's ``MLPCauchyRegressor`` and ``MLPCausalRegressor``). The published
LIFT/GPT-3 (ada) and LIFT/GPT-J rows are quoted, **not re-run**.

**Metric.** $\mathrm{RAE} = \sum_i |\hat y_i - y_i| / \sum_i |\bar y - y_i|$ on the 100 noiseless test targets,
$\bar y$ their mean (LIFT's definition); 1 is what predicting the test mean scores. The tables give the mean ± the
standard deviation over the simulations. LIFT's published numbers drop, before the ratio, the test points whose
error exceeds 3 times the method's RMSE; that *LIFT RAE* is used wherever a published number is compared.

**Goals** (measured, not claims): CausalQwen's RAE below Qwen digits' on every function, clean and with outliers;
with outliers, CausalQwen below the published LIFT/GPT-J on at least 4 of the 6 functions (LIFT RAE); moonshot:
with outliers, within 2× of the robust polynomial (the better of Huber and Cauchy) on the smooth functions
(linear, quadratic, exponential, cosine). The claims are what must hold for the comparison to be fair.
"""  # noqa: E501

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from pathlib import Path

import numpy as np
import torch

from causalqwen.files.data import collate
from causalqwen.numbers import find_numbers

from .common import ExperimentResult, fmt, module_text
from .comparison_eval import greedy_numbers, token_texts_of
from .domains import pretrained_starting_point
from .lift_baselines import CLASSICAL, QUICK_METHODS, ROBUST, baseline_predictions
from .lift_data import CONDITIONS, FUNCTIONS, LiftData, generate, prompt_text, training_text
from .qwen_finetuning import finetune_qwen
from .v9_comparison import BATCH, SEED, train_causal
from .v11_arithmetic import NumberTokenLossTerm
from .v14_report import (
    LM_ARMS,
    chosen_settings,
    lift_figure,
    report_body,
    report_claims,
    report_headline,
    save_predictions,
)

QUICK = {"functions": ("linear", "exponential"), "sims": (1,), "steps": 20, "lr": 1e-2, "methods": QUICK_METHODS}
FULL = {"functions": FUNCTIONS, "sims": (1, 2, 3), "steps": 200, "lr": 1e-2, "methods": CLASSICAL + ROBUST}
MAX_NEW_TOKENS = 12  # the longest answer, "-123.456@", is 9 tokens of the tiny tokenizer


@torch.no_grad()
def causal_predictions(model, numeric_tokenizer, x_values, batch_size: int = 100) -> np.ndarray:
    r"""CausalQwen's answer for each input: $\mathrm{loc}_Y$ (standard inference) at the position before the
    answer's ``<NUM>``, the last ``<NUM>`` of the text. The text is written with the answer 0, which no earlier
    position sees (causal attention)."""
    num_id = numeric_tokenizer.num_token_id
    items, positions = [], []
    for x in x_values:
        ids, values = numeric_tokenizer.encode(training_text(float(x), 0.0))
        answer_at = max(i for i, token in enumerate(ids) if token == num_id)
        if ids.count(num_id) != 2:
            raise ValueError(f"x = {x!r}: expected the input and the answer as the two <NUM> of the text")
        items.append(
            {
                "input_ids": torch.tensor(ids, dtype=torch.long),
                "numeric_values": torch.tensor(values, dtype=torch.float32),
            }
        )
        positions.append(answer_at - 1)
    was_training = model.training
    model.eval()
    answers: list[float] = []
    try:
        for start in range(0, len(items), batch_size):
            batch = collate(items[start : start + batch_size], numeric_tokenizer.pad_token_id)
            law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
            rows = torch.arange(len(batch["input_ids"]))
            where = torch.tensor(positions[start : start + batch_size])
            answers += model.action(law.loc_U[rows, where], law.scale_U[rows, where]).loc_Y.double().tolist()
    finally:
        model.train(was_training)
    return np.asarray(answers, dtype=np.float64)


def text_checks(qwen_tokenizer, datasets: list[LiftData]) -> dict:
    """How many texts the grammar does not read as exactly (x, answer), the answer ending the text, and how many
    test prompts do not tokenize (Qwen) as the start of their texts."""
    misread = mismatches = 0
    for data in datasets:
        for x, y in zip(data.x_train, data.y_train):
            text = training_text(x, y)
            found = find_numbers(text)
            misread += len(found) != 2 or found[0].start != text.index("=") + 1 or found[-1].end != len(text) - 3
        for x, y in zip(data.x_test, data.y_test):
            prompt_ids = qwen_tokenizer(prompt_text(x), add_special_tokens=False)["input_ids"]
            text_ids = qwen_tokenizer(training_text(x, y), add_special_tokens=False)["input_ids"]
            mismatches += text_ids[: len(prompt_ids)] != prompt_ids
    return {"misread": misread, "prompt_mismatches": mismatches}


def _qwen_arm(qwen_base, qwen_tokenizer, data: LiftData, settings: dict, ntl: bool) -> dict:
    """One digit arm trained on ``data`` and answering its test prompts (unparseable: the training mean)."""
    texts = [training_text(x, y) for x, y in zip(data.x_train, data.y_train)]
    term = NumberTokenLossTerm(qwen_tokenizer, qwen_base.config.vocab_size) if ntl else None
    model, trainable = finetune_qwen(
        qwen_base,
        qwen_tokenizer,
        texts,
        "head",
        steps=settings["steps"],
        batch_size=BATCH,
        learning_rate=settings["lr"],
        seed=SEED,
        extra_loss=term,
    )
    written = np.asarray(
        greedy_numbers(
            model,
            qwen_tokenizer,
            [prompt_text(x) for x in data.x_test],
            MAX_NEW_TOKENS,
            100,
            token_texts_of(qwen_tokenizer, model.config.vocab_size),
        ),
        dtype=np.float64,
    )
    unparseable = ~np.isfinite(written)
    return {
        "predicted": np.where(unparseable, float(np.mean(data.y_train)), written),
        "unparseable": int(unparseable.sum()),
        "trainable": trainable,
        "steps": len(model.train_losses),
        "ntl_finite_steps": (len(term.values) if np.isfinite(term.values).all() else 0) if term else None,
    }


def _causal_arm(qwen_base, numeric_tokenizer, data: LiftData, settings: dict) -> dict:
    texts = [training_text(x, y) for x, y in zip(data.x_train, data.y_train)]
    model, trainable, history = train_causal(qwen_base, numeric_tokenizer, texts, "causal", settings, None)
    return {
        "predicted": causal_predictions(model, numeric_tokenizer, data.x_test),
        "unparseable": 0,
        "trainable": trainable,
        "steps": max(record.get("step", 0) for record in history),
    }


def _language_models(datasets: list[LiftData], settings: dict, starting_point) -> tuple[dict, dict]:
    """Every LM arm on every data set: ``({arm: {key: run}}, {stage: seconds})``."""
    qwen_base, qwen_tokenizer, numeric_tokenizer = starting_point
    runs: dict = {arm: {} for arm in LM_ARMS}
    seconds = dict.fromkeys(LM_ARMS, 0.0)
    for data in datasets:
        for arm in LM_ARMS:
            clock = time.perf_counter()
            if arm == "CausalQwen":
                runs[arm][data.key] = _causal_arm(qwen_base, numeric_tokenizer, data, settings)
            else:
                runs[arm][data.key] = _qwen_arm(qwen_base, qwen_tokenizer, data, settings, arm.endswith("NTL"))
            seconds[arm] += time.perf_counter() - clock
    return runs, seconds


def run(quick: bool, out_dir: Path, **choices) -> ExperimentResult:
    """The study (`FULL`, or `QUICK`), with any setting replaced by ``choices`` (``functions=("cosine",)``,
    ``sims=(1,)``, ``steps=400``); the raw answers go to ``v14_predictions.json`` beside the page."""
    settings = {**chosen_settings(QUICK if quick else FULL, choices), "dual_lr": 1.0}  # dual_lr: no bound is set
    started = time.perf_counter()
    datasets = [
        generate(function, sim, condition)
        for condition in CONDITIONS
        for function in settings["functions"]
        for sim in settings["sims"]
    ]
    # the tabular baselines run in a worker process on the second core while the language models train here
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        clock = time.perf_counter()
        pending = pool.submit(baseline_predictions, datasets, settings["methods"])
        starting_point = pretrained_starting_point()
        checks = text_checks(starting_point[1], datasets)
        runs, seconds = _language_models(datasets, settings, starting_point)
        baselines = pending.result()
        seconds["baselines (worker, overlapping)"] = time.perf_counter() - clock
    measured = {
        "datasets": datasets,
        "settings": settings,
        "runs": runs,
        "baselines": baselines,
        "checks": checks,
        "seconds": seconds,
        "elapsed": time.perf_counter() - started,
    }
    save_predictions(measured, Path(out_dir) / "v14_predictions.json")
    title, text = module_text(__name__)
    return ExperimentResult(
        name="V14",
        title=title,
        claims=report_claims(measured),
        body=report_body(text, measured),
        figures=[lift_figure(measured, out_dir)],
        headline=report_headline(measured),
        settings=(
            f"{settings['steps']} steps for every language-model arm, batch {BATCH}, learning rate "
            f"{fmt(settings['lr'])}, seed {SEED}; functions {', '.join(settings['functions'])}; simulations "
            f"{', '.join(map(str, settings['sims']))}; baselines {', '.join(settings['methods'])}; one torch thread, "
            "the baselines in one worker process beside the training. Sizing (measured on linear, simulation 1, "
            "200 steps, learning rates 0.005 / 0.01 / 0.03 / 0.1): CausalQwen RAE 0.99 / 0.36 / 0.89 / 0.91, Qwen "
            "digits 0.95 / 0.72 / 0.65 / 0.80; CausalQwen reached 0.23 in 400 steps, which the 15-minute budget "
            "does not hold (a CausalQwen step costs about 2.5 Qwen steps here)"
        ),
    )
