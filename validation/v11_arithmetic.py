r"""An outside benchmark: DeepMind's arithmetic problems, CausalQwen against Qwen and Qwen with the Number Token Loss

**Question.** On data nobody in this project wrote, with a baseline loss that its own authors published, does
reading numbers as values (``<NUM>``) and answering with a regression value help? The data are the arithmetic
modules of DeepMind's *mathematics-dataset* (Saxton et al., ICLR 2019): addition / subtraction and
multiplication of integers and decimals, with the package's own interpolation (test) and extrapolation
(longer numbers) splits. The peer method is the Number Token Loss (Zausinger et al., "Regress, Don't Guess",
ICML 2025), from its authors' package ``ntloss`` used as published.

**Data** (`validation/data/arithmetic.jsonl`, made once by `validation.make_arithmetic_data`, which documents
the package version, the seed, the modules and the sympy shim it needs): 3000 training problems (``train``
split, modules ``add_or_sub`` and ``mul``, 1500 each), 300 ``interpolate`` problems (the same two modules at
the test entropy) and 300 ``extrapolate`` problems (``add_or_sub_big``, ``mul_big``: more digits than any
training operand). Kept are the problems whose answer the project's number grammar reads as exactly one number
and whose question holds exactly two (the operands); no evaluation question occurs in training. Each problem is
the text

    Question: {question}
    Answer:
    {answer}

(the line break after ``Answer:`` makes Qwen2's pre-tokenizer end the prompt with the same token whatever the
answer's sign, so the prompt tokenizes as the start of the training text; this is checked below). CausalQwen
reads every number as one ``<NUM>`` with its float32 value, Qwen as digit tokens.

**Three arms, one base, one budget.** All start from the same pretrained tiny Qwen2
(`validation.domains.pretrained_base`, pretrained on number-free English) and train the same number of steps,
with the same batch size, learning rate, warm-up and schedule, on the same training texts, with the backbone
frozen and the same trainable parameters up to $3H + 1$ values (the V9 pairing, `validation.comparison_eval`):

| arm | trainable (backbone frozen) | loss |
|---|---|---|
| Qwen CE | `head`: untied lm_head + bias + residual adapter on $z$ | next-token cross-entropy |
| Qwen CE + NTL | the same | cross-entropy $+\ 0.3\,\mathcal L_{\mathrm{NTL}}$ (`ntloss.NTLoss`, the Wasserstein NTL with its defaults, weight as its README recommends) |
| CausalQwen | `causal`: $\vec w_{\mathrm{num}}$, abduction network, head | the project's loss (`causalqwen.train`), `from_qwen` at its defaults except gate $\alpha = 1$, $\lambda = 0.1$ (as V9) |

The NTL term: at each position whose target is a digit token $d^{*}$, with $q_i$ the softmax over the ten digit
tokens only, $\ell = \sum_{i=0}^{9} q_i\,|i - d^{*}|$ (the Wasserstein-1 distance between $q$ and the point mass on
$d^{*}$), reweighed by the total probability mass $m$ on digit tokens as ``ntloss`` does by default,
$\ell \mapsto m\,\ell + 1.01 \cdot 9\,(1 - m)$, averaged over the digit targets of the batch.

**Answers and metrics**, on the held-out problems of both splits (all of them, the same for every arm):

* Qwen (both arms): the prompt ``Question: {question}\nAnswer:\n`` is greedily continued (up to 32 tokens,
  stopping after the first token that cannot continue a number; `validation.comparison_eval.greedy_numbers`)
  and the continuation is read by the grammar; no number at its start is *unparseable*.
* CausalQwen: standard inference, $\hat y = \mathrm{loc}_Y$ at the position whose next token is the answer's
  ``<NUM>`` (the last ``<NUM>`` of the text).
* *Exact match*: judged in float32, the precision in which the grammar reads every number. Qwen: the value of
  what it wrote equals the grammar's value of the answer. CausalQwen: $\mathrm{loc}_Y$ rounded to the answer's
  number of decimals (its *resolution*) equals it. With more than about 7 significant digits this accepts any
  prediction in the same float32 cell as the answer, for both; and a float32 $\mathrm{loc}_Y$ cannot hit every
  integer above $2^{24}$, a limit of CausalQwen's values (decision D3) that stays in the measurement.
* *MdAE*: the median of $|\hat y - y|$ ($y$ the exact answer, $\hat y = \mathrm{loc}_Y$ unrounded for
  CausalQwen), over all problems of a split, with an unparseable answer counted as an infinite error (the
  project's *strict* MdAE: infinite when half or more are unparseable); the unparseable share beside it, and the
  MdAE over the parseable answers alone, and the median $|\hat y|$ of the answers given.
* A reference that learns nothing: always answering 0. Its MdAE is the median $|y|$; an arm whose MdAE is not
  below it has not shown, on this metric, that it computes anything.

The goal (not a claim): CausalQwen's extrapolation MdAE below both Qwen arms'. It is reported as measured in
the **Who wins** lines. The claims are what must hold for the comparison to be fair.
"""  # noqa: E501

from __future__ import annotations

import time
from pathlib import Path

import torch

from causalqwen.files.data import collate

from .arithmetic_problems import (
    Problem,
    exact_causal,
    exact_qwen,
    load_problems,
    scores,
    select,
)
from .common import ExperimentResult, fmt, module_text
from .comparison_eval import greedy_numbers, token_texts_of
from .domains import pretrained_starting_point
from .qwen_finetuning import finetune_qwen
from .v9_comparison import BATCH, OVERRIDES, SEED, train_causal
from .v11_report import SPLITS, arithmetic_figure, headline_text, report_body, report_claims

# dual_lr is read by v9's train_causal (the step of the divergence bound's multiplier; no bound is set here)
QUICK = {"steps": 3000, "train_texts": 3000, "eval_per_module": 50, "lr": 1e-2, "dual_lr": 20.0}
FULL = {"steps": 8000, "train_texts": 3000, "eval_per_module": 150, "lr": 1e-2, "dual_lr": 20.0}
NTL_WEIGHT = 0.3  # the ntloss README: loss = cross_entropy + 0.3 * ntl
MAX_NEW_TOKENS = 32  # answers have at most 30 characters (make_arithmetic_data), then one token to stop


# ---------------------------------------------------------------------------------------------
# The peer loss: ntloss's NTLoss on the Qwen side
# ---------------------------------------------------------------------------------------------


class NumberTokenLossTerm:
    r"""``weight`` $\cdot$ `ntloss.NTLoss` (Wasserstein NTL, the package's defaults) as an ``extra_loss`` of
    `validation.qwen_finetuning.finetune_qwen`: called with the model's logits ``[B, S, V]`` and the batch's
    labels ``[B, S]`` (unshifted, -100 at padding), it scores position i against ``labels[i+1]``, as the
    cross-entropy does. The unweighted value of every call is kept in ``values``."""

    def __init__(self, tokenizer, vocab_size: int, weight: float = NTL_WEIGHT):
        from ntloss import NTLoss

        known = len(tokenizer)
        self.loss = NTLoss(tokenizer=tokenizer, vocab_size=vocab_size)
        if len(tokenizer) != known:
            raise RuntimeError("ntloss added digit tokens: this tokenizer does not hold the ten digits as tokens")
        self.weight = weight
        self.values: list[float] = []

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        value = self.loss(logits[:, :-1].float(), labels[:, 1:])
        self.values.append(float(value.detach()))
        return self.weight * value


# ---------------------------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------------------------


def qwen_answers(model, tokenizer, problems: list[Problem]) -> list[float]:
    """Qwen's answer to each problem: the number its greedy continuation of the prompt starts with (NaN:
    unparseable)."""
    was_training = model.training
    model.eval()
    try:
        return greedy_numbers(
            model,
            tokenizer,
            [p.prompt for p in problems],
            MAX_NEW_TOKENS,
            64,
            token_texts_of(tokenizer, model.config.vocab_size),
        )
    finally:
        model.train(was_training)


@torch.no_grad()
def causal_answers(model, numeric_tokenizer, problems: list[Problem], batch_size: int = 64) -> list[float]:
    r"""CausalQwen's answer to each problem: $\mathrm{loc}_Y$ (standard inference) at the position before the
    answer's ``<NUM>``, the last ``<NUM>`` of the text (the question's two operands are the others)."""
    num_id = numeric_tokenizer.num_token_id
    items, positions = [], []
    for problem in problems:
        ids, values = numeric_tokenizer.encode(problem.text)
        if ids.count(num_id) != 3 or ids[-1] != num_id:
            raise ValueError(f"{problem.text!r}: expected two operands and the answer as <NUM>, the answer last")
        items.append(
            {
                "input_ids": torch.tensor(ids, dtype=torch.long),
                "numeric_values": torch.tensor(values, dtype=torch.float32),
            }
        )
        positions.append(len(ids) - 2)
    was_training = model.training
    model.eval()
    answers = []
    try:
        for start in range(0, len(items), batch_size):
            batch = collate(items[start : start + batch_size], numeric_tokenizer.pad_token_id)
            law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
            rows = torch.arange(len(batch["input_ids"]))
            where = torch.tensor(positions[start : start + batch_size])
            decision = model.action(law.loc_U[rows, where], law.scale_U[rows, where])
            answers += decision.loc_Y.double().tolist()
    finally:
        model.train(was_training)
    return answers


# ---------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------


def _prompt_mismatches(qwen_tokenizer, evaluation: dict) -> int:
    """How many evaluation prompts do not tokenize as the start of their texts (Qwen's prompt must: the answer's
    first token is not merged into it)."""
    prompt_mismatches = 0
    for problem in [p for split in SPLITS for p in evaluation[split]]:
        prompt_ids = qwen_tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]
        text_ids = qwen_tokenizer(problem.text, add_special_tokens=False)["input_ids"]
        prompt_mismatches += text_ids[: len(prompt_ids)] != prompt_ids
    return prompt_mismatches


def _qwen_arms(qwen_base, qwen_tokenizer, train_texts: list[str], evaluation: dict, settings: dict) -> dict:
    """The two Qwen arms (cross-entropy, and with the NTL term) trained and scored on both splits: their
    ``trainable``, ``results``, ``seconds``, ``train_losses`` and the ``ntl_term`` (with its values)."""
    arms = {
        "trainable": {},
        "results": {},
        "seconds": {},
        "train_losses": {},
        "ntl_term": NumberTokenLossTerm(qwen_tokenizer, qwen_base.config.vocab_size),
    }
    for arm, extra in (("Qwen CE", None), ("Qwen CE + NTL", arms["ntl_term"])):
        clock = time.perf_counter()
        model, arms["trainable"][arm] = finetune_qwen(
            qwen_base,
            qwen_tokenizer,
            train_texts,
            "head",
            steps=settings["steps"],
            batch_size=BATCH,
            learning_rate=settings["lr"],
            seed=SEED,
            extra_loss=extra,
        )
        arms["seconds"][arm + " train"] = time.perf_counter() - clock
        arms["train_losses"][arm] = model.train_losses
        clock = time.perf_counter()
        arms["results"][arm] = {}
        for split in SPLITS:
            predicted = qwen_answers(model, qwen_tokenizer, evaluation[split])
            exact = [exact_qwen(y, p) for y, p in zip(predicted, evaluation[split])]
            arms["results"][arm][split] = scores(predicted, exact, evaluation[split]) | {"predicted": predicted}
        arms["seconds"][arm + " eval"] = time.perf_counter() - clock
    return arms


def _causal_arm(qwen_base, numeric_tokenizer, train_texts: list[str], evaluation: dict, settings: dict) -> dict:
    """CausalQwen trained and scored on both splits: its ``trainable``, ``results``, ``seconds`` and ``history``."""
    clock = time.perf_counter()
    causal, trainable, history = train_causal(qwen_base, numeric_tokenizer, train_texts, "causal", settings, None)
    seconds = {"CausalQwen train": time.perf_counter() - clock}
    clock = time.perf_counter()
    results = {}
    for split in SPLITS:
        predicted = causal_answers(causal, numeric_tokenizer, evaluation[split])
        exact = [exact_causal(y, p) for y, p in zip(predicted, evaluation[split])]
        results[split] = scores(predicted, exact, evaluation[split]) | {"predicted": predicted}
    seconds["CausalQwen eval"] = time.perf_counter() - clock
    return {"trainable": trainable, "results": results, "seconds": seconds, "history": history}


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    settings = QUICK if quick else FULL
    started = time.perf_counter()
    header, problems = load_problems()
    train_problems = select(problems, "train")[: settings["train_texts"]]
    evaluation = {split: select(problems, split, settings["eval_per_module"]) for split in SPLITS}
    train_texts = [p.text for p in train_problems]
    qwen_base, qwen_tokenizer, numeric_tokenizer = pretrained_starting_point()
    prompt_mismatches = _prompt_mismatches(qwen_tokenizer, evaluation)
    qwen = _qwen_arms(qwen_base, qwen_tokenizer, train_texts, evaluation, settings)
    causal = _causal_arm(qwen_base, numeric_tokenizer, train_texts, evaluation, settings)
    measured = dict(
        header=header,
        train_problems=train_problems,
        evaluation=evaluation,
        results=qwen["results"] | {"CausalQwen": causal["results"]},
        trainable=qwen["trainable"] | {"CausalQwen": causal["trainable"]},
        seconds=qwen["seconds"] | causal["seconds"],
        elapsed=time.perf_counter() - started,
        train_losses=qwen["train_losses"],
        ntl_values=qwen["ntl_term"].values,
        history=causal["history"],
    )

    zero = {
        split: scores([0.0] * len(evaluation[split]), [p.value == 0 for p in evaluation[split]], evaluation[split])
        for split in SPLITS
    }  # the reference: always answer 0
    figure_name = arithmetic_figure(measured["results"], zero, evaluation, out_dir)
    title, text = module_text(__name__)
    return ExperimentResult(
        name="V11",
        title=title,
        claims=report_claims(measured, prompt_mismatches, settings["steps"]),
        body=report_body(text, measured, zero),
        figures=[figure_name],
        headline=headline_text(measured["results"], zero),
        settings=(
            f"{settings['steps']} steps for every arm, batch {BATCH}, learning rate {fmt(settings['lr'])}, "
            f"seed {SEED}, {len(train_problems)} training problems, {settings['eval_per_module']} per module "
            f"and split held out, NTL weight {fmt(NTL_WEIGHT)}, CausalQwen "
            + ", ".join(f"{k} = {fmt(v)}" for k, v in OVERRIDES.items())
            + "; wall time with one torch thread on 2 shared CPU cores: quick about 160 s, full about 450 s"
        ),
    )
