"""transformers.Trainer drives CausalQwenForCausalLM as it is: loss first in the output, 3 optimisation steps."""

from functools import partial

import pytest
import torch
from transformers import Trainer, TrainingArguments

from causalqwen.data import TextDataset, collate, synthetic_texts
from causalqwen.tiny import build_tiny_causal_lm


def test_trainer_trains_three_steps(tmp_path):
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    data = TextDataset(synthetic_texts(24, seed=0), tokenizer, max_length=32)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3,
                             logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             remove_unused_columns=False, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id))
    result = trainer.train()
    assert result.global_step == 3
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert "action.b_noise" in changed and "model.abduction.W_loc" in changed and "model.embed_tokens.weight" in changed
    # the output puts the loss first, as Trainer expects of a model output
    batch = collate([data[0], data[1]], tokenizer.pad_token_id)
    out = model(**batch)
    assert out.to_tuple()[0] is out.loss and out.loss.dim() == 0


def test_trainer_evaluate_reports_the_models_loss(tmp_path):
    """Trainer takes both `labels` and `numeric_labels` for labels (forward arguments named *label*); the collated
    batches carry both, so `evaluate()` reports an `eval_loss`: the model's own loss on the batch."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    data = TextDataset(synthetic_texts(8, seed=1), tokenizer, max_length=32)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=8, report_to=[], use_cpu=True,
                             remove_unused_columns=False, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, eval_dataset=data,
                      data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id))
    metrics = trainer.evaluate()
    with torch.no_grad():
        expected = model.eval()(**collate(data.items, tokenizer.pad_token_id)).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_a_compiled_training_step_matches_eager():
    """torch.compile (default inductor backend) of forward with the fused loss and backward: the same loss and
    gradients as eager. (It used to fail inside the fused loss, which called torch.autograd.grad.)"""
    import copy

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.train()
    batch = collate(TextDataset(synthetic_texts(4, seed=0), tokenizer, max_length=32).items, tokenizer.pad_token_id)

    def step(m):
        out = m(**batch)
        out.loss.backward()
        return out.loss.detach()

    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    expected = step(eager)
    torch._dynamo.reset()
    actual = torch.compile(step)(compiled)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
