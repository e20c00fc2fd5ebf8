"""Checks at the doors: host synchronisations per training forward and per generated token, and a log step
whose memory stays at the training step's.

A host synchronisation is a call that needs a value on the host: ``Tensor.__bool__``, ``.item``, ``.tolist``,
``nonzero``, a boolean-mask index and friends. On a GPU each one stalls the device. They are recorded with a
``TorchFunctionMode`` and attributed to the package when the nearest caller outside torch is in ``causalqwen``
(Qwen2's own mask check in ``transformers`` is its business, and is reported separately).
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode
from wall_clock import budget

from causalqwen import cauchy, generate
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.inference import MODES

PACKAGE = os.path.dirname(__import__("causalqwen").__file__)
SYNCING = {
    torch.Tensor.__bool__,
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.numpy,
    torch.Tensor.masked_select,
    torch.masked_select,
    torch.unique,
    torch.Tensor.unique,
    torch.argwhere,
}


class HostSyncs(TorchFunctionMode):
    """Counts synchronising calls, split by who made them: the package or anyone else."""

    def __init__(self):
        super().__init__()
        self.ours, self.theirs = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        index = args[1] if func is torch.Tensor.__getitem__ and len(args) > 1 else None
        boolean_index = any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (index if isinstance(index, tuple) else (index,))
        )
        if func in SYNCING or boolean_index:
            frame = sys._getframe(1)
            while frame is not None and f"{os.sep}torch{os.sep}" in frame.f_code.co_filename:
                frame = frame.f_back
            caller = frame.f_code.co_filename if frame is not None else ""
            (self.ours if caller.startswith(PACKAGE) else self.theirs).append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_a_training_forward_with_loss_synchronises_at_most_twice(tiny):
    model, tokenizer = tiny
    batch = collate(TextDataset(synthetic_texts(4, seed=0), tokenizer, max_length=64).items, tokenizer.pad_token_id)
    assert not bool(batch["attention_mask"].all())  # padded: the mask is checked too
    model.train()
    with HostSyncs() as syncs:
        out = model(**batch)
        out.loss.backward()
    model.eval()
    # one transfer for every check of the inputs, one for the rows the fused loss scores (there were 17-18)
    assert len(syncs.ours) <= 2, syncs.ours
    assert torch.isfinite(out.loss) and int(out.n_cls) > 0 and int(out.n_reg) > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padded", [False, True])
def test_generation_synchronises_at_most_once_per_token(tiny, mode, padded):
    model, tokenizer = tiny
    prompts = ["The price is 12.5 yuan and", "He ran 3 km"] if padded else ["The price is 12.5 yuan and"]
    enc = tokenizer(prompts, padding_side="left")
    counts = {}
    for tokens in (4, 12):
        with HostSyncs() as syncs:
            out = generate(
                model,
                enc["input_ids"],
                enc["numeric_values"],
                enc["attention_mask"],
                mode=mode,
                max_new_tokens=tokens,
                eos_token_id=[],
                generator=torch.Generator().manual_seed(0),
            )
        assert out.sequences.shape[1] == enc["input_ids"].shape[1] + tokens
        counts[tokens] = (len(syncs.ours), len(syncs.theirs))
    per_token = (counts[12][0] - counts[4][0]) / 8  # the door's checks happen once, before the first token
    assert per_token <= 1, counts  # there were 12-14
    if not padded:  # without padding Qwen2 gets no mask, so it makes no check of its own either
        assert counts[12][1] == counts[4][1], counts


def test_the_tiled_argmax_is_predict(tiny):
    model, tokenizer = tiny
    enc = tokenizer(["The price is 12.5 yuan and", "He ran 3 km in 14 minutes"])
    assert model.config.loss_algorithm == "fused"  # standard_token takes the argmax tile by tile
    with torch.no_grad():
        out = model(**enc)
        literal, _ = model.action.predict(model.action(out.loc_U, out.scale_U))
        tiled = model.action.standard_token(
            out.loc_U.reshape(-1, out.loc_U.shape[-1]), out.scale_U.reshape(-1, out.loc_U.shape[-1])
        )
    assert torch.equal(tiled, literal.reshape(-1))


_MEMORY_SCRIPT = textwrap.dedent("""
    import gc, resource, sys, torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from causalqwen import CausalQwenForCausalLM
    from causalqwen.metrics import training_metrics
    torch.manual_seed(0)
    V, H = 131072, 32
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    model = CausalQwenForCausalLM.from_qwen(qwen, num_token_id=V - 1)
    del qwen
    ids = torch.randint(0, V - 1, (8, 64))
    batch = {"input_ids": ids, "numeric_values": torch.zeros(8, 64), "attention_mask": torch.ones_like(ids),
             "labels": ids}
    out = model(**batch)
    out.loss.backward()
    gc.collect()
    step = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    metrics = training_metrics(model, out)
    logged = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(step, logged, metrics["train/accuracy"])
""")


def test_the_log_step_stays_within_the_training_steps_memory():
    """At V = 131072 the [8, 63, V] decisions are 264 MB per float32 tensor; the log step must not form them."""
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=budget(300),
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    step_kb, logged_kb, accuracy = done.stdout.split()
    assert 0.0 <= float(accuracy) <= 1.0
    # peak resident set after the log step: within 5% of the training step's (a [B, S, V] tensor would add 264 MB)
    assert int(logged_kb) <= 1.05 * int(step_kb), (step_kb, logged_kb)


# ---- the doors follow the one switch, cauchy.validating() ----


def test_a_forward_under_validation_false_neither_checks_nor_synchronises(tiny):
    """The door refuses a value beside a token that is not <NUM>; under ``cauchy.validation(False)`` (a caller that
    has checked) it does not look, and the forward makes no host synchronisation of its own."""
    model, tokenizer = tiny
    enc = tokenizer(["The price is 12.5 yuan and"])
    stray = enc["numeric_values"].clone()
    stray[0, 0] = 7.0  # the first token is not <NUM>
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"numeric_values must be 0 wherever input_ids is not <NUM>.*\[0, 0\]"):
            model(enc["input_ids"], stray)
        checked = model(**enc)
        with cauchy.validation(False), HostSyncs() as syncs:
            trusted = model(**enc)
            model(enc["input_ids"], stray)  # not looked at
    assert syncs.ours == [], syncs.ours
    assert torch.equal(trusted.loc_S, checked.loc_S) and torch.equal(trusted.loc_U, checked.loc_U)
    assert cauchy.validating()


class _RecordValidating:
    """A forward hook on the abduction network, which every step of both generation loops runs: whether
    `cauchy.validating()` was on while the step ran."""

    def __init__(self, module):
        self.seen = []
        self.handle = module.register_forward_hook(lambda *_: self.seen.append(cauchy.validating()))


@pytest.mark.parametrize("loop", ["causalqwen.generate", "model.generate"])
def test_generation_checks_the_prompt_at_its_door_and_runs_every_step_unchecked(tiny, loop):
    model, tokenizer = tiny
    enc = tokenizer(["The price is 12.5 yuan and", "He ran 3 km"], padding_side="left")
    bad = enc["numeric_values"].clone()
    bad[1, -1] = 2.0  # beside a token that is not <NUM>

    def run(values):
        if loop == "causalqwen.generate":
            return generate(model, enc["input_ids"], values, enc["attention_mask"], max_new_tokens=3)
        return model.generate(
            enc["input_ids"],
            numeric_values=values,
            attention_mask=enc["attention_mask"],
            max_new_tokens=3,
            return_dict_in_generate=True,
        )

    with pytest.raises(ValueError, match="numeric_values must be 0 wherever input_ids is not <NUM>"):
        run(bad)  # the door looks at the prompt
    recorder = _RecordValidating(model.model.abduction)
    try:
        out = run(enc["numeric_values"])
    finally:
        recorder.handle.remove()
    steps = out.sequences.shape[1] - enc["input_ids"].shape[1]
    assert steps >= 1 and recorder.seen == [False] * steps  # one step per new token, none checked again
    assert cauchy.validating()  # the block ends with the call


@pytest.mark.parametrize("loop", ["causalqwen.generate", "model.generate"])
def test_with_validation_off_the_generation_door_takes_the_prompt_as_checked(tiny, loop):
    """``cauchy.set_validate_args(False)``: the same continuation of a valid prompt, and the prompt not looked at."""
    model, tokenizer = tiny
    enc = tokenizer(["The price is 12.5 yuan and", "hello"], padding_side="left")
    bad = enc["numeric_values"].clone()
    bad[1, -1] = 2.0

    def run(values):
        if loop == "causalqwen.generate":
            return generate(model, enc["input_ids"], values, enc["attention_mask"], max_new_tokens=4)
        return model.generate(
            enc["input_ids"],
            numeric_values=values,
            attention_mask=enc["attention_mask"],
            max_new_tokens=4,
            return_dict_in_generate=True,
        )

    checked = run(enc["numeric_values"])
    cauchy.set_validate_args(False)
    try:
        trusted = run(enc["numeric_values"])
        run(bad)  # not looked at
    finally:
        cauchy.set_validate_args(True)
    assert torch.equal(trusted.sequences, checked.sequences)
    assert torch.equal(trusted.numeric_values, checked.numeric_values)


def test_an_error_inside_a_generation_step_leaves_the_switch_on(tiny):
    """A stopping criterion that raises in the middle of transformers' loop: the error reaches the caller, and
    the inputs of the next call are checked again."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Fails(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            assert not cauchy.validating()  # inside the loop
            raise RuntimeError("a stopping criterion failed")

    model, tokenizer = tiny
    enc = tokenizer(["The price is 12.5 yuan and"])
    with pytest.raises(RuntimeError, match="a stopping criterion failed"):
        model.generate(**enc, max_new_tokens=3, stopping_criteria=StoppingCriteriaList([Fails()]))
    assert cauchy.validating()
    with pytest.raises(ValueError, match="input_ids must lie in"):
        model(enc["input_ids"] + model.config.vocab_size)
