r"""Qwen2 vs CausalQwen on domain B: the Qwen side, its four trainable variants and its fine-tuning loop.

**Fine-tuning the Qwen side** (`finetune_qwen`). Both models start from the same pretrained base
(`validation.domains.pretrained_base`). The Qwen2 side keeps its softmax head and reads numbers as digit
tokens; what it trains is one of four variants, built by `adapt_qwen` around a copy of the base
(the base itself is never changed):

| variant | trainable | count (H hidden, V vocabulary rows) | matches CausalQwen preset |
|---|---|---|---|
| ``"head"`` | an untied copy of lm_head ``[V, H]`` + a bias ``[V]`` (zero) + the residual adapter | $VH + V + 2H^2 + 2H$ | ``causal`` ($VH + V + 2H^2 + 2H + 3H + 1$) |
| ``"adapter"`` | the residual adapter only (lm_head stays the base's, frozen) | $2H^2 + 2H$ | ``abduction`` ($2H^2 + 2H$) |
| ``"lora"`` | peft LoRA (rank $r$) on q, k, v, o, gate, up, down of every layer + the ``"head"`` parameters | $VH + V + 2H^2 + 2H + r\sum(\text{in} + \text{out})$ | -- |
| ``"all"`` | every weight: the backbone (embeddings included) + the ``"head"`` parameters | all | ``all`` |

The residual adapter acts on the final hidden state (after the last norm, where lm_head and CausalQwen's
abduction network read it): $z \mapsto z + W_2\,\mathrm{gelu}(W_1 z + b_1) + b_2$ with $W_1, W_2$ ``[H, H]``;
$W_1$ gets ``nn.Linear``'s default initialisation (seeded), $b_1 = 0$, $W_2 = 0$, $b_2 = 0$. So every variant
starts exactly at the base's logits ($W_2 = 0$, $b_2 = 0$, head bias 0, LoRA's $B = 0$).
The loop is literal: AdamW (weight decay on matrices only), linear warm-up then cosine decay
(``transformers.get_cosine_schedule_with_warmup``), gradient clipping at 1.0, next-token cross-entropy on
every token, or with ``prompts`` on the completion alone (the prompt's labels -100; EOS appended, right padding
with labels -100), batches by `validation.qwen_batches.batch_order`
(a function of the number of texts, batch size, steps and seed alone, the same for any model).

The metrics both sides are scored with are `validation.comparison_eval`.
"""  # noqa: E501

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen2ForCausalLM, get_cosine_schedule_with_warmup
from transformers.modeling_outputs import CausalLMOutputWithPast

from causalqwen.integrations.lora import LORA_TARGET_MODULES

from .qwen_batches import batch_order, collate_rows, encode_qwen_rows, next_token_loss

__all__ = [
    "VARIANTS",
    "LORA_TARGETS",
    "ResidualAdapter",
    "AdaptedQwen",
    "adapt_qwen",
    "finetune_qwen",
    "count_trainable",
]

VARIANTS = ("head", "adapter", "lora", "all")
LORA_TARGETS = LORA_TARGET_MODULES  # the same seven projections as CausalQwen's adapters


class ResidualAdapter(nn.Module):
    r"""$z \mapsto z + W_2\,\mathrm{gelu}(W_1 z + b_1) + b_2$; ``up`` = $(W_1, b_1)$, ``down`` = $(W_2, b_2)$, the
    latter zero."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.up = nn.Linear(hidden_size, hidden_size)
        self.down = nn.Linear(hidden_size, hidden_size)
        with torch.no_grad():
            self.up.bias.zero_()
            self.down.weight.zero_()
            self.down.bias.zero_()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.down(F.gelu(self.up(z)))


class AdaptedQwen(nn.Module):
    """A copy of a Qwen2 base's backbone (``backbone``, a ``Qwen2Model``, with LoRA layers for ``"lora"``), the
    residual ``adapter`` on its final hidden state, and ``lm_head`` (with a bias, except for ``"adapter"``).

    ``forward(input_ids, attention_mask=None, position_ids=None, labels=None)`` returns a
    ``CausalLMOutputWithPast`` with ``logits`` ``[B, S, V]`` and, given labels, the mean next-token
    cross-entropy (position i against ``labels[i+1]``, -100 ignored), as a ``Qwen2ForCausalLM`` does.
    """

    def __init__(self, backbone: nn.Module, adapter: ResidualAdapter, lm_head: nn.Linear, variant: str, config):
        super().__init__()
        self.backbone = backbone
        self.adapter = adapter
        self.lm_head = lm_head
        self.variant = variant
        self.config = config
        self.train_losses: list[float] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None, **kwargs):
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        ).last_hidden_state  # [B, S, H]
        logits = self.lm_head(self.adapter(hidden))  # [B, S, V]
        loss = None
        if labels is not None:
            loss = next_token_loss(logits, labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


def count_trainable(model: nn.Module) -> int:
    """The number of trainable values (each shared parameter once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def adapt_qwen(
    base: Qwen2ForCausalLM, variant: str, seed: int = 0, *, lora_rank: int = 8, lora_alpha: float | None = None
) -> AdaptedQwen:
    """The untrained ``variant`` model around a deep copy of ``base`` (see the module docstring), with exactly
    the variant's parameters trainable. The new random values (W_1, LoRA's A) come from a generator seeded
    with ``seed``; the global random state is left as it was. ``lora_alpha`` defaults to ``2 * lora_rank``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if not isinstance(base, Qwen2ForCausalLM):
        raise TypeError(f"base must be a Qwen2ForCausalLM, got {type(base).__name__}")
    hidden, vocab = base.config.hidden_size, base.config.vocab_size
    base_head = base.get_output_embeddings().weight.detach()  # [V, H] (tied to the embedding in the tiny base)
    backbone = copy.deepcopy(base.model)
    backbone.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        adapter = ResidualAdapter(hidden).to(base_head.dtype)
        if variant == "lora":
            from peft import LoraConfig, inject_adapter_in_model

            config = LoraConfig(
                r=lora_rank,
                lora_alpha=lora_alpha if lora_alpha is not None else 2 * lora_rank,
                lora_dropout=0.0,
                target_modules=list(LORA_TARGETS),
                bias="none",
            )
            backbone = inject_adapter_in_model(config, backbone)
    for name, parameter in backbone.named_parameters():
        parameter.requires_grad_(variant == "all" or (variant == "lora" and "lora_" in name))
    head = nn.Linear(hidden, vocab, bias=variant != "adapter").to(base_head.dtype)
    with torch.no_grad():
        head.weight.copy_(base_head)
        if head.bias is not None:
            head.bias.zero_()
    head.requires_grad_(variant != "adapter")
    model = AdaptedQwen(backbone, adapter, head, variant, base.config)
    return model.eval()


def prompt_token_counts(tokenizer, texts: list[str], prompts: list[str]) -> list[int]:
    """The number of tokens of each prompt, checked to be the first tokens of its text."""
    if len(prompts) != len(texts):
        raise ValueError(f"{len(prompts)} prompts for {len(texts)} texts")
    counts = []
    for index, (prompt, text) in enumerate(zip(prompts, texts)):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not text.startswith(prompt) or text_ids[: len(prompt_ids)] != prompt_ids:
            raise ValueError(f"text {index}: its prompt {prompt!r} does not tokenize as the start of the text")
        counts.append(len(prompt_ids))
    return counts


def finetune_qwen(
    base: Qwen2ForCausalLM,
    tokenizer,
    texts: list[str],
    variant: str,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    lora_rank: int = 8,
    lora_alpha: float | None = None,
    weight_decay: float = 0.01,
    warmup_steps: int | None = None,
    max_grad_norm: float = 1.0,
    extra_loss=None,
    prompts: list[str] | None = None,
) -> tuple[AdaptedQwen, int]:
    """Fine-tune the ``variant`` of ``base`` on ``texts``: ``(model, n_trainable)``, the model in eval mode.

    `adapt_qwen` (seeded with ``seed``), then ``steps`` steps of the literal loop of the module docstring:
    batches `batch_order` (len(texts), batch_size, steps, seed) of `encode_qwen_rows` (EOS appended),
    AdamW (betas 0.9, 0.999; ``weight_decay`` on trainable matrices only), warm-up ``warmup_steps`` (default
    10% of the steps) then cosine decay to 0, gradient norm clipped at ``max_grad_norm``. The training loss
    of every step is kept in ``model.train_losses``. ``steps=0`` returns the untrained model.

    ``extra_loss`` (optional): a callable ``(logits, labels) -> scalar tensor`` added to the cross-entropy of
    every step, with the model's ``logits`` ``[B, S, V]`` and the batch's ``labels`` ``[B, S]`` as they are
    (not shifted: position i predicts ``labels[i+1]``; -100 at padding). ``train_losses`` then holds the sum.

    ``prompts`` (optional): for each text, its prompt, a prefix of it whose tokens are the first tokens of the text
    (a ``ValueError`` otherwise); their labels are -100, so both losses score the completion alone.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    model = adapt_qwen(base, variant, seed, lora_rank=lora_rank, lora_alpha=lora_alpha)
    n_trainable = count_trainable(model)
    if steps == 0:
        return model, n_trainable
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=learning_rate,
    )
    warmup = warmup_steps if warmup_steps is not None else max(1, round(0.1 * steps))
    scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, steps)
    rows = encode_qwen_rows(tokenizer, texts)
    prompt_lengths = prompt_token_counts(tokenizer, texts, prompts) if prompts is not None else [0] * len(rows)
    model.train()
    for indices in batch_order(len(rows), batch_size, steps, seed):
        batch = collate_rows([rows[i] for i in indices], tokenizer.pad_token_id, [prompt_lengths[i] for i in indices])
        output = model(**batch)
        loss = output.loss
        if extra_loss is not None:
            loss = loss + extra_loss(output.logits, batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        model.train_losses.append(loss.item())
    return model.eval(), n_trainable
