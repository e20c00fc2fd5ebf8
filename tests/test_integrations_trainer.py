"""transformers.Trainer drives CausalQwenForCausalLM as it is: loss first in the output, 3 optimisation steps."""

from functools import partial

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments

from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, collate, synthetic_texts


def trainer_set_up_as_train(config, tmp_path):
    """The tiny CausalQwen, its optimizer and schedule, and transformers' ``TrainingArguments`` set up as
    ``causalqwen.train`` sets them up for ``config`` (batches of 12, clipping, a step logged each step):
    what a ``Trainer`` needs to take the same steps as ``train``."""
    from transformers import get_cosine_schedule_with_warmup

    from causalqwen.training import parameter_groups, set_trainable

    theirs, _, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    set_trainable(theirs, config.preset)
    optimizer = torch.optim.AdamW(parameter_groups(theirs, config.weight_decay), lr=config.learning_rate)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.warmup_steps, config.steps)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=config.steps,
        per_device_train_batch_size=12,
        max_grad_norm=config.max_grad_norm,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    return theirs, (optimizer, scheduler), args


def test_trainer_trains_three_steps(tmp_path):
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    data = TextDataset(synthetic_texts(24, seed=0), tokenizer, max_length=32)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=data, data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id)
    )
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


def test_trainer_with_bf16_mixed_precision_trains(tmp_path):
    """``TrainingArguments(bf16=True)``: transformers' mixed precision (autocast over float32 weights) through the
    fused loss, whose tile products then run in bfloat16."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    data = TextDataset(synthetic_texts(24, seed=0), tokenizer, max_length=32)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=data, data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id)
    )
    autocast_seen = []
    model.model.abduction.register_forward_pre_hook(lambda *_: autocast_seen.append(torch.is_autocast_enabled("cpu")))
    assert trainer.train().global_step == 3
    assert autocast_seen == [True] * 3
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay float32


def test_trainer_evaluate_reports_the_models_loss(tmp_path):
    """`collate`'s batches carry `labels` (Trainer's one label name) and `numeric_labels`, so `evaluate()` reports
    an `eval_loss`: the model's own loss on the batch."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    data = TextDataset(synthetic_texts(8, seed=1), tokenizer, max_length=32)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=8,
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, eval_dataset=data, data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id)
    )
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


def _eval_trainer(tmp_path, model, data, tokenizer, metrics, batch_size):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=batch_size,
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    return Trainer(
        model=model,
        args=args,
        eval_dataset=data,
        processing_class=tokenizer,
        data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id),
        compute_metrics=metrics.compute_metrics,
        preprocess_logits_for_metrics=metrics.preprocess_logits_for_metrics,
    )


def test_trainer_metrics_equal_evaluate_batch(tmp_path):
    """TrainerMetrics gives Trainer.evaluate the metrics of causalqwen.metrics.evaluate_batch: on one batch all
    of them, the causal OvR sum included (the same generator); over three batches of different lengths (Trainer
    pads them with -100 to concatenate) every metric that draws nothing."""
    from causalqwen.metrics import TrainerMetrics, evaluate_batch

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.eval()
    data = TextDataset(
        synthetic_texts(12, seed=3) + ["a 5", "the 1,000 yuan and 2.5 kg of tea cost 7 more today"],
        tokenizer,
        max_length=48,
    )
    expected = evaluate_batch(
        model, collate(data.items, tokenizer.pad_token_id), generator=torch.Generator().manual_seed(0)
    )
    one = _eval_trainer(
        tmp_path, model, data, tokenizer, TrainerMetrics(model, torch.Generator().manual_seed(0)), len(data)
    ).evaluate()
    assert set(expected) <= {name.removeprefix("eval_") for name in one}
    for name, value in expected.items():
        assert one[f"eval_{name}"] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert expected["reg_count"] > 0 and expected["tokens"] > 100
    three = _eval_trainer(
        tmp_path, model, data, tokenizer, TrainerMetrics(model, torch.Generator().manual_seed(0)), 5
    ).evaluate()
    for name, value in expected.items():
        if "causal" not in name or name == "ovr_causal_draws":  # the draws follow Trainer's batches
            assert three[f"eval_{name}"] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_trainer_saves_the_tokenizer_given_as_processing_class(tmp_path):
    """Trainer(processing_class=NumericTokenizer) saves it beside the model; both load back through the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from causalqwen import NumericTokenizer

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    data = TextDataset(synthetic_texts(8, seed=0), tokenizer, max_length=32)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
        save_strategy="no",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id),
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    loaded = AutoTokenizer.from_pretrained(tmp_path / "final", trust_remote_code=True)
    assert isinstance(loaded, NumericTokenizer) and loaded.encode("tea 2.5 kg") == tokenizer.encode("tea 2.5 kg")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final", trust_remote_code=True)
    for (name, a), b in zip(model.named_parameters(), reloaded.parameters()):
        assert torch.equal(a.detach(), b.detach()), name


def test_trainer_and_causalqwen_train_give_the_same_loss_curve(tmp_path):
    """Same data, preset, AdamW groups, cosine schedule with warm-up and clipping: transformers.Trainer and
    causalqwen.train give the same loss at every step. Each step takes the whole data set as its batch,
    so the two samplers' orders do not matter (the loss is a mean over scored positions)."""
    from causalqwen import train
    from causalqwen.training import TrainingConfig

    config = TrainingConfig(
        steps=6,
        batch_size=12,
        learning_rate=5e-3,
        warmup_steps=2,
        log_every=1,
        eval_every=100,
        save_every=100,
        preset="causal",
    )
    ours, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    data = TextDataset(synthetic_texts(12, seed=0), tokenizer, max_length=32)
    history = train(ours, data, config, progress=False)
    expected = [record["train/total_loss"] for record in history]

    theirs, (optimizer, scheduler), args = trainer_set_up_as_train(config, tmp_path)
    trainer = Trainer(
        model=theirs,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == len(expected) == config.steps
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    assert expected[-1] < expected[0]  # it learned


def plain_rows(tokenizer, length=16, count=8):
    """The plain transformers recipe's rows: ``input_ids``, ``numeric_values``, ``attention_mask``, ``labels`` (a copy
    of ``input_ids``), all ``length`` long, from synthetic texts with at least that many tokens."""
    rows = []
    for text in synthetic_texts(60, seed=2):
        ids, values = tokenizer.encode(text)
        if len(ids) >= length and len(rows) < count:
            rows.append(
                {
                    "input_ids": torch.tensor(ids[:length]),
                    "numeric_values": torch.tensor(values[:length]),
                    "attention_mask": torch.ones(length, dtype=torch.long),
                    "labels": torch.tensor(ids[:length]),
                }
            )
    assert len(rows) == count
    return rows


def test_trainer_finds_labels_alone_and_forward_still_takes_numeric_labels():
    """Trainer's label names are ["labels"] (numeric_labels is optional: it defaults to numeric_values); forward
    still takes numeric_labels in fifth place and by keyword, and uses it."""
    import inspect

    from transformers.utils import find_labels

    from causalqwen.modeling import CausalQwenForCausalLM

    assert find_labels(CausalQwenForCausalLM) == ["labels"]
    assert "numeric_labels" not in inspect.signature(CausalQwenForCausalLM.forward).parameters
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.eval()
    batch = collate(plain_rows(tokenizer, count=2), tokenizer.pad_token_id)
    is_num = batch["labels"] == tokenizer.num_token_id  # a numeric label stands beside a <NUM> label only
    moved = torch.where(is_num, batch["numeric_values"] * 3 + 1, 0.0)
    with torch.no_grad():
        positional = model(batch["input_ids"], batch["numeric_values"], batch["attention_mask"], batch["labels"], moved)
        keyword = model(**{**batch, "numeric_labels": moved})
        default = model(batch["input_ids"], batch["numeric_values"], batch["attention_mask"], batch["labels"])
    assert positional.loss.item() == keyword.loss.item() != default.loss.item()
    assert torch.equal(positional.numeric_labels, moved) and default.numeric_labels is batch["numeric_values"]


def _plain_trainer(tmp_path, model, rows, batch_size, **kwargs):
    from transformers import default_data_collator

    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=batch_size, report_to=[], use_cpu=True, disable_tqdm=True
    )  # remove_unused_columns left at its default
    return Trainer(model=model, args=args, eval_dataset=rows, data_collator=default_data_collator, **kwargs)


def test_the_plain_recipe_reports_the_models_eval_loss(tmp_path):
    """default_data_collator on rows of input_ids, numeric_values, attention_mask, labels: evaluate() reports
    eval_loss, the mean of the model's own losses on the same two batches."""
    from transformers import default_data_collator

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    rows = plain_rows(tokenizer)
    metrics = _plain_trainer(tmp_path, model, rows, 4).evaluate()
    with torch.no_grad():
        losses = [model.eval()(**default_data_collator(rows[start : start + 4])).loss.item() for start in (0, 4)]
    assert metrics["eval_loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)


def test_the_plain_recipes_compute_metrics_gets_the_law_of_U_and_the_labels(tmp_path):
    """compute_metrics receives predictions = (loc_U, scale_U, loc_Y, scale_Y, numeric_labels) and label_ids =
    labels; the accuracy and the regression error formed from them with the model's head equal evaluate_batch's."""
    from transformers import default_data_collator

    from causalqwen.metrics import evaluate_batch

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.eval()
    rows = plain_rows(tokenizer)
    received = {}

    def compute_metrics(prediction):
        loc_U, scale_U, loc_Y, _, numeric_labels = (torch.as_tensor(part) for part in prediction.predictions)
        labels = torch.as_tensor(prediction.label_ids)
        received.update(labels=labels, numeric_labels=numeric_labels, shapes=[p.shape for p in prediction.predictions])
        scored = labels[:, 1:] != -100  # position i is scored against labels[i+1]
        predicted = model.action.predict(model.action(loc_U, scale_U))[0][:, :-1]
        is_num = scored & (labels[:, 1:] == model.config.num_token_id)
        errors = (loc_Y[:, :-1] - numeric_labels[:, 1:]).abs()[is_num]
        return {
            "accuracy": (predicted == labels[:, 1:])[scored].float().mean().item(),
            "reg_mae": errors.double().mean().item(),
        }

    metrics = _plain_trainer(tmp_path, model, rows, 4, compute_metrics=compute_metrics).evaluate()
    batch = default_data_collator(rows)
    expected = evaluate_batch(model, batch, generator=torch.Generator().manual_seed(0))
    assert expected["reg_count"] > 0 and 0 < expected["accuracy"] < 1
    assert metrics["eval_accuracy"] == pytest.approx(expected["accuracy"], rel=1e-6)
    assert metrics["eval_reg_mae"] == pytest.approx(expected["reg_mae"], rel=1e-5)
    assert torch.equal(received["labels"], batch["labels"])
    assert torch.equal(received["numeric_labels"], batch["numeric_values"])
    causal_size = model.config.causal_size
    assert received["shapes"] == [(8, 16, causal_size), (8, 16, causal_size), (8, 16), (8, 16), (8, 16)]


@pytest.mark.parametrize("recipe", ["plain", "label pair"])
def test_trainer_metrics_on_the_plain_recipe_and_with_a_label_pair_equal_evaluate_batch(tmp_path, recipe):
    """TrainerMetrics with the plain recipe (labels alone, the numeric labels from the output), and with collate and
    label_names=["labels", "numeric_labels"] (the pair): every metric of evaluate_batch, on one batch."""
    from transformers import default_data_collator

    from causalqwen.metrics import TrainerMetrics, evaluate_batch

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.eval()
    rows = plain_rows(tokenizer)
    metrics = TrainerMetrics(model, torch.Generator().manual_seed(0))
    hooks = dict(
        compute_metrics=metrics.compute_metrics, preprocess_logits_for_metrics=metrics.preprocess_logits_for_metrics
    )
    if recipe == "plain":
        result = _plain_trainer(tmp_path, model, rows, len(rows), **hooks).evaluate()
    else:
        items = [{"input_ids": row["input_ids"], "numeric_values": row["numeric_values"]} for row in rows]
        args = TrainingArguments(
            output_dir=str(tmp_path),
            per_device_eval_batch_size=len(rows),
            report_to=[],
            use_cpu=True,
            remove_unused_columns=False,
            disable_tqdm=True,
            label_names=["labels", "numeric_labels"],
        )
        result = Trainer(
            model=model,
            args=args,
            eval_dataset=items,
            **hooks,
            data_collator=partial(collate, pad_token_id=tokenizer.pad_token_id),
        ).evaluate()
    expected = evaluate_batch(model, default_data_collator(rows), generator=torch.Generator().manual_seed(0))
    assert expected["reg_count"] > 0 and "eval_loss" in result
    for name, value in expected.items():
        assert result[f"eval_{name}"] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_the_label_declaration_and_trainer_metrics_refuse_what_they_cannot_read():
    """signature_for_trainer names a forward without numeric_labels; TrainerMetrics names label names it cannot use."""
    from causalqwen.integrations.trainer import signature_for_trainer
    from causalqwen.metrics import TrainerMetrics

    def forward(input_ids, labels=None):
        return input_ids

    with pytest.raises(TypeError, match="has no parameter numeric_labels"):
        signature_for_trainer(forward)
    model, _, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    outputs = (torch.zeros(1, 3, 64), torch.ones(1, 3, 64))
    with pytest.raises(ValueError, match=r'label names must be \["labels"\]'):
        TrainerMetrics(model).preprocess_logits_for_metrics(outputs, (torch.zeros(1, 3), torch.zeros(1, 3), None))


# ---------------------------------------------------------------------------------------------
# transformers' own collators over datasets.map(tokenizer), under Trainer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["row by row", "batched"])
@pytest.mark.parametrize("collator_name", ["DataCollatorWithPadding", "DataCollatorForLanguageModeling"])
def test_transformers_collators_over_datasets_map_train_and_the_model_sees_every_value(
    tmp_path, collator_name, batched
):
    """``Dataset.map(lambda row: tokenizer(row["text"]))`` (one text: lists; or ``batched=True``: a batch of
    tensors), transformers' ``DataCollatorWithPadding`` (labels added by the map) or
    ``DataCollatorForLanguageModeling(mlm=False)``, and ``Trainer``, which rebuilds each batch with
    ``type(batch)({...})``: two steps train, and the model's forward receives the value of every number of the
    data set (two steps of four rows: the eight texts once), as ``encode`` reads them, beside its ``<NUM>``."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    texts = synthetic_texts(8, seed=4)
    with_labels = collator_name == "DataCollatorWithPadding"

    def encode(rows):
        encoding = tokenizer(rows["text"])
        return {**encoding, "labels": encoding["input_ids"]} if with_labels else encoding

    dataset = Dataset.from_dict({"text": texts}).map(encode, batched=batched, batch_size=3, remove_columns=["text"])
    collator = (
        DataCollatorWithPadding(tokenizer) if with_labels else DataCollatorForLanguageModeling(tokenizer, mlm=False)
    )
    seen = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].clone(), kwargs["numeric_values"].clone())),
        with_kwargs=True,
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    assert trainer.train().global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    num = tokenizer.num_token_id
    received = sorted(value for ids, values in seen for value in values[ids == num].tolist())
    written = sorted(
        float(np.float32(value)) for text in texts for token, value in zip(*tokenizer.encode(text)) if token == num
    )
    assert len(seen) == 2 and len(written) >= 8 and received == written
    assert all(values.dtype == torch.float32 for _, values in seen)


def test_answer_figures_under_trainer_are_evaluate_batchs_and_read_each_prompts_last_token(tmp_path):
    """Prompt-completion rows: `evaluate_batch` and `TrainerMetrics` (one batch and three) report the same answer
    figures, and these are `answer_figures` of the laws that `predict_number` reads for each prompt alone."""
    from causalqwen.files.data import PromptCompletion
    from causalqwen.metrics import TrainerMetrics, evaluate_batch
    from causalqwen.regression import answer_figures, predict_number

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.eval()
    rows = [PromptCompletion(f"The price is {x} yuan. Again, the price is ", f"{x} yuan.") for x in (3, 17, 40, 88)]
    rows += [PromptCompletion(f"One apple costs {p} yuan, so two apples cost ", f"{2 * p} yuan.") for p in (2, 9, 25)]
    rows += [PromptCompletion("A week has ", "seven days.")]  # a completion without a number: no answer
    data = TextDataset(rows, tokenizer, max_length=48)
    expected = evaluate_batch(
        model, collate(data.items, tokenizer.pad_token_id), generator=torch.Generator().manual_seed(0)
    )
    law = predict_number(model, tokenizer, [row.prompt for row in rows[:-1]])
    answers = torch.tensor([float(row.completion.split(" ")[0]) for row in rows[:-1]])
    oracle = answer_figures(answers, law.loc.double(), law.scale.double())
    assert expected["answer_count"] == 7
    for name, value in oracle.items():
        assert expected[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for batch_size in (len(data), 3):
        metrics = TrainerMetrics(model, torch.Generator().manual_seed(0))
        result = _eval_trainer(tmp_path, model, data, tokenizer, metrics, batch_size).evaluate()
        for name, value in expected.items():
            if name.startswith(("answer", "reg_")):
                assert result[f"eval_{name}"] == pytest.approx(value, rel=1e-5, abs=1e-6), (batch_size, name)
