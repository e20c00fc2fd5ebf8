"""V16 (validation/v16_lift_tuned.py, v16_report.py): the Qwen side trained on the completion alone with every weight,
the flatness ratio against hand computation, bad settings, and the quick run end to end."""

import json

import numpy as np
import pytest
import torch

from validation.common import write_study
from validation.qwen_batches import collate_rows
from validation.qwen_finetuning import adapt_qwen, count_trainable, finetune_qwen, prompt_token_counts
from validation.v16_lift_tuned import flatness, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the studies run with one thread


def test_collate_rows_ignores_each_rows_prompt():
    batch = collate_rows([[5, 6, 7, 8], [9, 10]], pad_token_id=0, prompt_lengths=[3, 1])
    assert batch["labels"].tolist() == [[-100, -100, -100, 8], [-100, 10, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_the_all_variant_trains_every_weight_and_prompts_are_checked():
    from causalqwen.app.tiny import build_tiny_base

    base, tokenizer = build_tiny_base(seed=0)
    model = adapt_qwen(base, "all")
    assert count_trainable(model) == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert prompt_token_counts(tokenizer, ["a cup of tea 5"], ["a cup of tea "]) == [
        len(tokenizer("a cup of tea ", add_special_tokens=False)["input_ids"])
    ]
    with pytest.raises(ValueError, match="text 0: its prompt 'tea' does not tokenize as the start"):
        prompt_token_counts(tokenizer, ["a cup of tea 5"], ["tea"])
    with pytest.raises(ValueError, match="1 prompts for 2 texts"):
        prompt_token_counts(tokenizer, ["a", "b"], ["a"])


def test_one_completion_only_step_of_the_all_variant_moves_the_embeddings_and_every_layer():
    from causalqwen.app.tiny import build_tiny_base

    base, tokenizer = build_tiny_base(seed=0)
    model, _ = finetune_qwen(
        base,
        tokenizer,
        ["a cup of tea 5"] * 4,
        "all",
        steps=1,
        batch_size=2,
        learning_rate=1e-2,
        seed=0,
        warmup_steps=0,
        prompts=["a cup of tea "] * 4,
    )
    before = dict(adapt_qwen(base, "all").backbone.named_parameters())
    changed = {name for name, p in model.backbone.named_parameters() if not torch.equal(p, before[name])}
    assert "embed_tokens.weight" in changed
    assert all(any(f"layers.{i}." in name for name in changed) for i in range(base.config.num_hidden_layers))


def test_flatness_is_the_last_tenth_over_the_tenth_before():
    losses = [5.0] * 80 + [2.0] * 10 + [1.0] * 10  # 100 values: the last tenth 1.0, the tenth before 2.0
    assert flatness(losses) == pytest.approx(0.5, rel=1e-15)
    assert flatness([3.0] * 40) == 1.0
    assert np.isnan(flatness([1.0]))


def test_unknown_settings_and_functions_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['function'\]"):
        run(True, tmp_path, function=("linear",))
    with pytest.raises(ValueError, match="unknown function 'sine'"):
        run(True, tmp_path, functions=("sine",))


@pytest.mark.slow
def test_quick_run_writes_its_page_figure_and_raw_answers(tmp_path):
    result = run(True, tmp_path)
    page = write_study(result, [("mode", "quick")], tmp_path).read_text()
    assert "LIFT RAE, outliers" in page and "validation RAE at" in page and "Where CausalQwen still loses" in page
    assert (tmp_path / "v16_training_loss.png").stat().st_size > 0
    saved = json.loads((tmp_path / "v16_predictions.json").read_text())
    answers = saved["arms"]["CausalQwen"]["linear/outliers/1"]
    assert len(answers["predicted"]) == 100 and answers["steps"] == 20
    assert set(saved["arms"]) == {"CausalQwen", "Qwen digits", "Qwen digits + NTL"}
    assert all(claim.passed for claim in result.claims), [c for c in result.claims if not c.passed]
