"""The core model, `causalqwen.model.CausalLM`: the design's steps around any backbone.

With a plain torch backbone (no transformers anywhere) it gives the loss of the steps taken one by one, trains, and
keeps the causal order; with the Qwen2 stack as its backbone it gives exactly what `CausalQwenForCausalLM` gives.

The path a reader follows from text to loss through it stays short (docs/path.md): ``tokenizer(text)`` then
``model(**enc, labels=ids).loss`` crosses at most `MAX_FILES` files and `MAX_FUNCTIONS` functions of the package with
the literal loss, and at most `MAX_FILES_FUSED` files with the default, fused one; following ``texts`` through the
tokenizer, control returns to a file at most `MAX_RETURNS` times.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import causalqwen
from causalqwen import NumericTokenizer
from causalqwen.abduction import AbductionNetwork
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.decision import DecisionHead
from causalqwen.embedding import NumericalEmbedding
from causalqwen.losses import next_token_targets, total_loss
from causalqwen.model import CausalLM

V, H, NUM = 12, 8, 11


def settings(**overrides) -> SimpleNamespace:
    """The head's settings, as a plain namespace: the core needs no transformers config."""
    fields = dict(
        causal_size=H,
        vocab_size=V,
        noise_init=0.1,
        scale_eps=1e-6,
        ovr_threshold=0.5,
        ovr_threshold_per_class=False,
        learnable_threshold=False,
        num_token_id=NUM,
        ignore_index=-100,
        loss_algorithm="literal",
        regression_weight=1.0,
        gate_alpha=0.0,
        detach_gate=True,
    )
    return SimpleNamespace(**(fields | overrides))


class CausalBlock(nn.Module):
    """A plain torch backbone: one causal self-attention layer, ``[B, S, H] -> [B, S, H]``."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(H, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)

    def forward(self, e):
        causal = nn.Transformer.generate_square_subsequent_mask(e.shape[1])
        return self.layer(e, src_mask=causal, is_causal=True)


def plain_model(seed=0, **overrides):
    torch.manual_seed(seed)
    modules = nn.ModuleDict(
        dict(
            embed_tokens=nn.Embedding(V, H),
            numerical_embedding=NumericalEmbedding(H),
            backbone=CausalBlock(),
            abduction=AbductionNetwork(H, H, scale_init=1.0),
            head=DecisionHead(settings(**overrides)),
        )
    )
    return CausalLM(**modules), modules


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, NUM, (2, 7), generator=g)
    ids[:, 2] = NUM
    values = torch.where(ids == NUM, torch.randn(ids.shape, generator=g) * 10, torch.zeros(ids.shape))
    return ids, values


def test_with_a_plain_backbone_the_loss_is_the_steps_taken_one_by_one():
    core, m = plain_model()
    ids, values = batch()
    out = core.forward(ids, values, labels=ids, return_decisions=True)
    e = m.embed_tokens(ids) + m.numerical_embedding(values)  # D4
    loc_U, scale_U = m.abduction(m.backbone(e))  # D5, D6
    loc_S, scale_S, loc_Y, scale_Y = m.head(loc_U, scale_U)  # D7
    targets = next_token_targets(ids, values, None, -100, NUM)  # D9
    law = (loc_S, scale_S, loc_Y, scale_Y)
    parts = total_loss(*law, targets.labels, targets.values, num_token_id=NUM, threshold=0.5, detach_gate=True)  # D8
    assert torch.equal(out.loc_U, loc_U) and torch.equal(out.scale_U, scale_U)
    assert torch.equal(out.loc_S, loc_S) and torch.equal(out.scale_Y, scale_Y)
    assert torch.equal(out.loss, parts.total) and out.n_reg == 2 and parts.n_reg == 2


def test_with_a_plain_backbone_the_fused_and_literal_losses_agree_in_value_and_every_gradient():
    ids, values = batch()
    results = []
    for algorithm in ("literal", "fused"):
        core, m = plain_model(loss_algorithm=algorithm)
        loss = core.forward(ids, values, labels=ids).loss
        results.append((loss, torch.autograd.grad(loss, list(m.parameters()))))
    (literal, literal_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, literal, rtol=1e-5, atol=1e-6)
    for got, expected in zip(fused_grads, literal_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_with_a_plain_backbone_the_model_trains_and_keeps_the_causal_order():
    core, m = plain_model()
    ids, values = batch()
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 1) % NUM
    with torch.no_grad():
        before, after = core.law_of_U(ids, values), core.law_of_U(changed, values)
    assert torch.equal(before[0][:, :-1], after[0][:, :-1]) and not torch.equal(before[0][:, -1], after[0][:, -1])
    optimizer = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = core.forward(ids, values, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_the_decisions_of_the_kept_positions_are_the_last_ones():
    core, _ = plain_model()
    ids, values = batch()
    with torch.no_grad():
        every = core.forward(ids, values)
        last_two = core.forward(ids, values, logits_to_keep=2)
        with_loss = core.forward(ids, values, labels=ids, logits_to_keep=2, return_decisions=True)
    assert every.loss is None and every.loc_S.shape == (2, 7, V) and last_two.loc_S.shape == (2, 2, V)
    for got in (last_two, with_loss):
        assert torch.equal(got.loc_S, every.loc_S[:, -2:]) and torch.equal(got.scale_Y, every.scale_Y[:, -2:])
    assert core.forward(ids, values, labels=ids).loc_S is None  # with labels, decisions only when asked


@pytest.mark.parametrize("algorithm", ["fused", "literal"])
def test_with_the_qwen2_stack_as_backbone_it_is_the_transformers_model(algorithm):
    """A backbone written here from transformers' ``Qwen2Model.forward`` gives exactly the loss, the decisions and
    the law of U of `CausalQwenForCausalLM`, padding included."""
    from transformers import Qwen2Model

    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0, loss_algorithm=algorithm)
    encoding = tokenizer(["A cup costs 3.5 dollars.", "It is 12 km long, 4 km wide."], return_tensors="pt")
    ids, values, mask = encoding["input_ids"], encoding["numeric_values"], encoding["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    inner = model.model

    def qwen2(e):
        return Qwen2Model.forward(inner, inputs_embeds=e, attention_mask=mask, position_ids=positions).last_hidden_state

    core = CausalLM(inner.embed_tokens, inner.numerical_embedding, qwen2, inner.abduction, model.action)
    with torch.no_grad():
        ours = core.forward(ids, values, labels=ids, attention_mask=mask, return_decisions=True)
        theirs = model(**encoding, labels=ids, return_decisions=True)
    assert bool(mask.eq(0).any())
    for name in ("loss", "reg_loss", "n_cls", "n_reg", "loc_U", "scale_U", "loc_S", "scale_S", "loc_Y", "scale_Y"):
        assert torch.equal(getattr(ours, name), theirs[name]), name


# ---- the path from text to loss ----
# Functions are counted as a profiler sees them (``sys.setprofile``): each distinct function, method or property of
# ``causalqwen/`` entered at least once; comprehensions and lambdas are part of the function that holds them. The
# limits are a ratchet at what the path takes now: lower them as the path gets shorter, never raise them.
# docs/path.md's last section names every function on the path and why it is there.

MAX_FILES, MAX_FUNCTIONS = 13, 50
MAX_FILES_FUSED = 15
TEXT = "A cup of coffee costs 3.5 dollars, and 12 cups cost 42 dollars."
PACKAGE = Path(causalqwen.__file__).resolve().parent


def traced_path(tokenizer, model) -> dict[str, set[str]]:
    """The package's files and functions entered by ``tokenizer(TEXT)`` and ``model(**enc, labels=ids).loss``."""
    seen: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            name = frame.f_code.co_qualname
            if path.is_relative_to(PACKAGE) and "<" not in name.rsplit(".", 1)[-1]:
                seen.setdefault(str(path.relative_to(PACKAGE)), set()).add(name)

    sys.setprofile(profile)
    try:
        encoding = tokenizer(TEXT, return_tensors="pt")
        loss = model(**encoding, labels=encoding["input_ids"]).loss
    finally:
        sys.setprofile(None)
    assert loss.isfinite()
    return seen


def test_the_literal_path_from_text_to_loss_is_short(tiny):
    model, tokenizer = tiny
    model.config.loss_algorithm = "literal"
    try:
        traced_path(tokenizer, model)  # first calls build caches; the path is what a second call runs
        seen = traced_path(tokenizer, model)
    finally:
        model.config.loss_algorithm = "fused"
    functions = sorted(f"{file}:{name}" for file, names in seen.items() for name in names)
    assert len(seen) <= MAX_FILES, sorted(seen)
    assert len(functions) <= MAX_FUNCTIONS, functions


def test_the_default_path_adds_the_fused_kernel_and_little_else(tiny):
    model, tokenizer = tiny
    assert model.config.loss_algorithm == "fused"
    traced_path(tokenizer, model)
    seen = traced_path(tokenizer, model)
    assert len(seen) <= MAX_FILES_FUSED, sorted(seen)


# ---- following texts through the tokenizer: control comes back to a file of the package at most MAX_RETURNS times ----
# The walk is what a profiler sees: at each call and return, the package file control is in (the innermost frame of
# causalqwen/ on the stack). A *stay* is a run of consecutive events in one file; a *return to a file* is a stay in a
# file that had been left before. Before the numbers pipeline was one pass, tokenizer(TEXT) made 19 stays in 5 files
# (14 returns), and one more return per number and per text.

MAX_RETURNS = 6
LINES = [
    TEXT,
    "价格是99.9元，温度-15.5度，第1章共2,345字。",
    "no numbers here",
    "1-2, 3-4, 5-6, 7-8, 9-10, 11-12",  # number-dense: its runs between numbers repeat
    "Version 3.10.2 shipped on 2024-03-15 with 1.5e3 fixes and 0x1F flags.",
]


def package_file(frame) -> str | None:
    """The package file of the innermost frame of ``causalqwen/`` on the stack from ``frame``, or None."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(PACKAGE):
            return str(path.relative_to(PACKAGE))
        frame = frame.f_back
    return None


def stays(call) -> list[str]:
    """The package files control stays in while ``call()`` runs, in order (consecutive events in one file: one stay)."""
    walk: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            where = package_file(frame)
        elif event == "return":
            where = package_file(frame.f_back)
        else:
            return
        if where is not None and (not walk or walk[-1] != where):
            walk.append(where)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


def returns_to_a_file(walk: list[str]) -> int:
    """How many stays are in a file that an earlier stay was in."""
    return len(walk) - len(set(walk))


@pytest.fixture(scope="module")
def padding_tokenizer():
    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


CALLS = {
    "one text, tensors": lambda tokenizer: tokenizer(TEXT, return_tensors="pt"),
    "one text, lists": lambda tokenizer: tokenizer(TEXT),
    "a batch, padded": lambda tokenizer: tokenizer(LINES),
    "a batch, right, numpy": lambda tokenizer: tokenizer(LINES, padding_side="right", return_tensors="np"),
    "a batch, lists, no mask": lambda tokenizer: tokenizer(
        LINES, padding=False, return_tensors=None, return_attention_mask=False
    ),
    "a number-dense batch": lambda tokenizer: tokenizer([LINES[3]] * 8 + [TEXT]),
    "a batch padded to max_length": lambda tokenizer: tokenizer(LINES, padding="max_length", max_length=64),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_following_texts_returns_to_a_file_at_most_six_times(padding_tokenizer, name):
    call = CALLS[name]
    call(padding_tokenizer)  # first calls fill caches; the walk is what a second call runs
    walk = stays(lambda: call(padding_tokenizer))
    assert walk[0] == walk[-1] == "integrations/tokenizer.py"
    assert returns_to_a_file(walk) <= MAX_RETURNS, walk


def test_the_walk_is_counted_as_stays_and_returns():
    walk = ["a.py", "b.py", "a.py", "c.py", "b.py", "a.py"]
    assert returns_to_a_file(walk) == 3
    assert stays(lambda: sorted([3, 1, 2])) == []  # nothing of the package runs
