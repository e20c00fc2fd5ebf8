r"""CausalQwen on the `transformers` Qwen2 stack: the core model (`causalqwen.model`) with Qwen2 as its backbone, as
`CausalQwenModel` (the law of $U$) and `CausalQwenForCausalLM` (decisions and loss).

The forward pass, position by position:

$$
e_i = \mathrm{embed}(x_i) + \phi(v_i) \;\xrightarrow{\ \text{Qwen2Model}\ }\; z_i
\;\xrightarrow{\ \text{abduction}\ }\; U_i \sim \mathrm{Cauchy}(\mathrm{loc}_{U_i}, \mathrm{scale}_{U_i})
\;\xrightarrow{\ \text{action}\ }\; S_{k,i},\ Y_i \sim \mathrm{Cauchy}(\cdot, \cdot)
\;\xrightarrow{\ \text{loss}\ }\; L.
$$

**Initialization equivalence.** With $W_{\mathrm{loc}} = I$, $b_{\mathrm{loc}} = 0$, $W_{\mathrm{cls}}$ = the base
model's lm_head and $b_{\mathrm{cls}} = 0$, $\mathrm{loc}_{S,i} = W_{\mathrm{cls}} z_i$, which is exactly the base
model's logit vector whenever no number is present ($\phi(0) = 0$). The scales are $\mathrm{scale}_{S_k} = (\gamma +
|b_{\mathrm{noise}}|)\cdot\|W_{\mathrm{cls},k}\|_1$ (for a constant noise vector) and differ per class, so $\arg\max_k
P_k$ need not be the base model's greedy token.

**One forward per job.** `CausalQwenForCausalLM.forward` is a straight line: the door (the checks and the positions,
`causalqwen.checks.doors.open_door`), then the core model (`causalqwen.model.CausalLM`: embedding, backbone, abduction,
action, loss, in the design's order) with the Qwen2 stack as its backbone (`Qwen2Backbone`). transformers' generation
loop runs it for the law of $U$ alone (``return_decisions=False``, under ``cauchy.validation(False)``: the prompt was
checked at ``generate``'s door); `causalqwen.integrations.generation_mixin` forms the mode's scores. What transformers
callers add (the cache's older name, the generation loop's and peft's keywords, Qwen2's masks for a padded batch,
`Trainer`'s label names) is sorted in the wing, `causalqwen.integrations.qwen2` and `causalqwen.integrations.trainer`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    Qwen2ForCausalLM,
    Qwen2Model,
)
from transformers.cache_utils import Cache
from transformers.models.qwen2.modeling_qwen2 import Qwen2PreTrainedModel
from transformers.utils import logging as transformers_logging

from .abduction import AbductionNetwork, build_abduction
from .action import ActionNetwork
from .cauchy import validation
from .checks.doors import check_keywords, open_door
from .configuration import CausalQwenConfig, config_from_base, conversion_settings
from .decision import DecisionHead
from .embedding import NumericalEmbedding
from .files.checkpoint import check_local_source
from .files.loading import (
    CACHE_NAME,
    check_qwen_base,
    num_token_id_from_tokenizer,
    strict_from_pretrained,
)
from .initialization import copy_base_weights, initial_threshold
from .integrations.auto import save_with_auto_classes
from .integrations.generation_mixin import CausalQwenGenerationMixin
from .integrations.outputs import CausalQwenModelOutput, CausalQwenOutput
from .integrations.qwen2 import ABDUCE_ARGS, MASKS_WITHOUT_A_LOOK, forward_keywords, one_cache, padded_masks
from .integrations.trainer import labels_for_trainer
from .integrations.vocabulary import VocabularyResizing
from .model import CausalLM

__all__ = [
    "CausalQwenModel",
    "CausalQwenForCausalLM",
    "CausalQwenOutput",
    "CausalQwenModelOutput",
    "Qwen2Backbone",
]

logger = logging.getLogger(__name__)


@dataclass
class Qwen2Backbone:
    """The Qwen2 stack as the core model's backbone for one forward: embeddings ``[B, S, H]`` to features
    ``[B, S, H]``, under that forward's mask, positions and KV cache, by transformers' own ``Qwen2Model.forward``.
    Qwen2's other outputs (the cache, the hidden states and attentions a switch asked for) are kept in ``outputs``.

    A mask here is taken to hold padding (the door drops one of all ones), so Qwen2 gets its attention masks built
    without its look at whether they could be dropped (`causalqwen.integrations.qwen2.padded_masks`): either way
    Qwen2 makes no host synchronisation."""

    model: Qwen2Model
    attention_mask: torch.Tensor | None = None  # [B, cached + S], holding padding
    position_ids: torch.LongTensor | None = None  # [B, S]
    cache: Cache | None = None
    use_cache: bool | None = None
    switches: dict = field(default_factory=dict)  # transformers' output switches (output_hidden_states, ...)
    outputs: dict = field(default_factory=dict)  # set by the call: the cache, hidden states, attentions

    def __call__(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        mask = self.attention_mask
        if mask is not None and MASKS_WITHOUT_A_LOOK:
            mask = padded_masks(self.model, inputs_embeds, mask, self.cache, self.position_ids)
        out = Qwen2Model.forward(
            self.model,
            inputs_embeds=inputs_embeds,
            attention_mask=mask,
            position_ids=self.position_ids,
            use_cache=self.use_cache,
            **{CACHE_NAME: self.cache},
            **self.switches,
        )
        self.outputs = {CACHE_NAME: getattr(out, CACHE_NAME), "hidden_states": out.hidden_states}
        self.outputs["attentions"] = out.attentions
        return out.last_hidden_state  # [B, S, H]


class CausalQwenPreTrainedModel(Qwen2PreTrainedModel):
    """What both CausalQwen classes share: the config class, the initialization of the new modules
    (decisions D4–D7, called by transformers for every module whose weights were not loaded), and
    strict loading (`causalqwen.files.loading`)."""

    config: CausalQwenConfig
    config_class = CausalQwenConfig
    base_model_prefix = "model"
    is_base_model = False

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus what lets a process that never imported causalqwen load the
        directory through the Auto classes and ``pipeline``: ``config.json`` names the classes (``auto_map``,
        and ``custom_pipelines`` for ``"text-generation"``) in a module ``causalqwen_auto.py`` written beside
        it, which imports them from the installed package (`causalqwen.integrations.auto`). Loading through it needs
        ``trust_remote_code=True``, transformers' consent to run a module from the directory.

        Nothing is written through a link: a ``save_directory`` that is a symbolic link, or a link (or a
        hard-linked file) under a name the save writes (``config.json``, ``model*.safetensors``, ...), is an
        ``OSError`` naming it, raised before anything is written (`causalqwen.files.rundir.check_write_targets`).

        A CausalQwen ``generation_config.mode`` is saved in ``generation_config.json`` with
        ``"_from_model_config": false``, so that transformers' loader keeps it; an invalid one is a ``ValueError``."""
        return save_with_auto_classes(self, super().save_pretrained, save_directory, *args, **kwargs)

    def _init_weights(self, module) -> None:
        super()._init_weights(module)
        if isinstance(module, (NumericalEmbedding, AbductionNetwork, ActionNetwork)):
            module.reset_parameters()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, made strict: a checkpoint loads completely or raises ``OSError``
        (`causalqwen.files.loading.strict_from_pretrained`). Every argument is passed on."""
        load = super().from_pretrained
        return strict_from_pretrained(cls, load, pretrained_model_name_or_path, model_args, kwargs)


class CausalQwenModel(CausalQwenPreTrainedModel, Qwen2Model):
    r"""The Qwen2 stack with the numerical embedding in front and the abduction network on top:
    $e = \mathrm{embed}(x) + \phi(v)$, $z = \mathrm{Qwen2}(e)$,
    $(\mathrm{loc}_U, \mathrm{scale}_U) = \mathrm{abduction}(z)$.

    It *is* a `Qwen2Model` (``embed_tokens``, ``layers``, ``norm`` keep their names, so a Qwen2 state dict
    and peft's module names apply unchanged) plus ``numerical_embedding`` and ``abduction``.
    """

    is_base_model = True

    def __init__(self, config: CausalQwenConfig):
        super().__init__(config)
        self.numerical_embedding = NumericalEmbedding(config.hidden_size, config.number_periods)
        self.abduction = build_abduction(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor,
        numeric_values: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> CausalQwenModelOutput:
        r"""The law of $U$ at every position, ``[B, S, C]`` twice. Inputs are checked here (one host
        synchronisation, `causalqwen.checks.doors.open_door`) while `causalqwen.cauchy.validating`. With an
        ``attention_mask`` and no ``position_ids``, positions count real tokens only, so that left padding does
        not shift them. The KV cache comes as ``cache`` (or, before transformers 5.24, ``past_key_values``)."""
        if past_key_values is not None:
            cache = one_cache(cache, past_key_values)
        check_keywords("forward", kwargs, ABDUCE_ARGS)
        mask, position_ids = open_door(
            self.config, input_ids, numeric_values, attention_mask, position_ids=position_ids, cache=cache
        )
        return self.law_of_U(
            input_ids, numeric_values, mask, position_ids=position_ids, cache=cache, use_cache=use_cache, **kwargs
        )

    def law_of_U(
        self,
        input_ids,
        numeric_values=None,
        attention_mask=None,
        *,
        position_ids=None,
        cache=None,
        use_cache=None,
        **kwargs,
    ) -> CausalQwenModelOutput:
        """`forward` on inputs already checked (and positions already formed): no check, no synchronisation. The core
        model's first half (`causalqwen.model.CausalLM.law_of_U`) with the Qwen2 stack as its backbone; a mask given
        here is taken to hold padding (`Qwen2Backbone`)."""
        qwen2 = Qwen2Backbone(self, attention_mask, position_ids, cache, use_cache, kwargs)
        core = CausalLM(self.embed_tokens, self.numerical_embedding, qwen2, self.abduction)
        loc_U, scale_U, z = core.law_of_U(input_ids, numeric_values)  # [B, S, C] x2, [B, S, H]
        return CausalQwenModelOutput(loc_U=loc_U, scale_U=scale_U, last_hidden_state=z, **qwen2.outputs)


@labels_for_trainer  # Trainer reads forward's label names: numeric_labels is optional, labels alone are required
class CausalQwenForCausalLM(VocabularyResizing, CausalQwenPreTrainedModel, CausalQwenGenerationMixin):
    """CausalQwen: `CausalQwenModel` (the law of $U$) and the `DecisionHead` (decisions and loss), run in the design's
    order by the core model (`causalqwen.model.CausalLM`).

    Attributes: ``model`` (the `CausalQwenModel`, a `Qwen2Model`), ``action`` (the `DecisionHead`, an `ActionNetwork`,
    whose classes follow ``resize_token_embeddings``: `VocabularyResizing`), and for reading convenience
    ``numerical_embedding``, ``abduction`` and ``ovr_threshold``, which belong to those two."""

    # The loss is a mean over this batch's scored positions and ignores Trainer's num_items_in_batch, so
    # Trainer must divide by the gradient-accumulation steps itself (and not pass that keyword).
    accepts_loss_kwargs = False

    def __init__(self, config: CausalQwenConfig):
        super().__init__(config)
        self.model = CausalQwenModel(config)
        self.action = DecisionHead(config)
        self.post_init()
        # Set, not left to defaults, so that callers which sample unless told otherwise (the text-generation
        # pipeline) do not: four of the five modes draw inside the model, and do_sample is traditional's.
        self.generation_config.do_sample = False

    @property
    def numerical_embedding(self) -> NumericalEmbedding:
        return self.model.numerical_embedding

    @property
    def abduction(self) -> AbductionNetwork:
        return self.model.abduction

    @property
    def ovr_threshold(self):
        """The OvR threshold $C_k$ (a number, or a ``[]`` / ``[V]`` tensor), owned by the head."""
        return self.action.ovr_threshold

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value) -> None:
        self.model.embed_tokens = value

    def abduce(
        self,
        input_ids: torch.LongTensor,
        numeric_values: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> CausalQwenModelOutput:
        r"""The first half of the forward pass, `CausalQwenModel.forward`: the law of $U$ ``[B, S, C]`` and the
        Qwen2 outputs. The inference modes (`causalqwen.inference`) start from here."""
        check_keywords("abduce", kwargs, ABDUCE_ARGS)
        return self.model(
            input_ids,
            numeric_values,
            attention_mask,
            position_ids=position_ids,
            cache=cache,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )

    def forward(
        self,
        input_ids: torch.LongTensor,
        numeric_values: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        numeric_labels: torch.FloatTensor | None = None,
        *,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        return_decisions: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalQwenOutput:
        r"""The whole model in a straight line: the law of $U$; with ``labels`` the loss of D8–D9; the standard
        decisions when ``return_decisions`` (by default, when no ``labels`` are given).

        ``labels`` are aligned with ``input_ids`` (transformers convention) and shifted inside
        (`causalqwen.losses.next_token_targets`): position $i$ is scored against ``labels[i+1]`` and
        ``numeric_labels[i+1]`` (default: ``numeric_values``), and only where ``attention_mask[i]``,
        ``attention_mask[i+1]`` are both 1 and ``labels[i+1] != ignore_index``. The loss algorithm is
        ``config.loss_algorithm``.

        For `transformers.Trainer` the signature leaves out the optional ``numeric_labels``
        (`causalqwen.integrations.trainer`): Trainer takes every parameter named *label* for a required label and
        scores an evaluation batch only when it holds them all; with ``["labels"]`` alone, ``evaluate()`` reports
        ``eval_loss`` for any batch with ``labels`` (``default_data_collator``'s too). Renaming the parameter
        would break callers; the function still takes ``numeric_labels`` fifth or by keyword.

        ``return_decisions`` (default: only when no ``labels`` are given) fills ``loc_S``/``scale_S``
        ``[B, S, V]``, ``logits`` ($\mathrm{loc}_S$) and ``loc_Y``/``scale_Y`` ``[B, S]``; ``logits_to_keep`` = K > 0
        forms them for the last K positions only (``[B, K, V]``, ``[B, K]``). Neither changes how the loss is
        computed. Without decisions and without ``labels`` the output is the law of $U$ alone (what a step of
        transformers' generation loop asks for: the mode's scores are formed from it,
        `causalqwen.integrations.generation_mixin`).
        All inputs are checked here with one host synchronisation (`causalqwen.checks.doors.open_door`) while
        `causalqwen.cauchy.validating`; the rest of the forward runs under ``cauchy.validation(False)``. A caller that
        has checked them runs the forward under ``cauchy.validation(False)`` too (``model.generate`` checks the
        prompt at its door, and every later step's token and value are the model's own), and the forward makes no
        synchronisation.
        """
        if past_key_values is not None:  # the KV cache's name before transformers 5.24
            cache = one_cache(cache, past_key_values)
        if kwargs:  # transformers' output switches pass on to Qwen2; generate's and peft's extras are dropped
            kwargs = forward_keywords(kwargs)
        # Qwen2's mask (None when the door found it all ones) and positions [B, S]; the loss reads attention_mask
        mask, positions = open_door(
            self.config,
            input_ids,
            numeric_values,
            attention_mask,
            position_ids=position_ids,
            cache=cache,
            labels=labels,
            numeric_labels=numeric_labels,
            threshold=self.action.ovr_threshold,
        )
        with validation(False):  # checked at the door: nothing below looks at the inputs again
            qwen2 = Qwen2Backbone(self.model, mask, positions, cache, use_cache, kwargs)
            inner = self.model
            core = CausalLM(inner.embed_tokens, inner.numerical_embedding, qwen2, inner.abduction, self.action)
            out = core.forward(
                input_ids,
                numeric_values,
                labels=labels,
                numeric_labels=numeric_labels,
                attention_mask=attention_mask,
                return_decisions=return_decisions,
                logits_to_keep=logits_to_keep,
            )
        return CausalQwenOutput(**out._asdict(), logits=out.loc_S, **qwen2.outputs)  # logits: transformers' name

    # ---- construction from a Qwen2 base ----

    @classmethod
    def from_qwen(
        cls, base: Qwen2ForCausalLM | str | os.PathLike, *, calibration=None, **config_overrides
    ) -> "CausalQwenForCausalLM":
        r"""Build CausalQwen from a Qwen2 base and apply the initialization of decisions D4–D7 and D14.

        ``base`` is a `Qwen2ForCausalLM` instance, a local directory or a hub id (loaded with
        ``Qwen2ForCausalLM.from_pretrained``). ``config_overrides`` set `CausalQwenConfig` fields;
        ``num_token_id`` is required for an instance and read from the tokenizer saved with a path
        (its ``<NUM>`` id if present, else ``len(tokenizer)``).

        The backbone weights are copied, ``W_cls`` becomes a copy of the base lm_head weight (its own
        parameter, never tied), and the new modules get their D4–D7 initialization. If
        ``num_token_id == vocab_size`` the embedding and the head grow by one row (decision D2).

        Scale and threshold (D14, `causalqwen.initialization`): unless overridden, $\gamma$ =
        ``abduction_scale_init`` = 0.1 and $C$ = ``ovr_threshold`` is computed from the base by the rule
        ``ovr_threshold_init`` (default ``"top_two_midpoint"``) on ``calibration`` (a mapping with ``input_ids``
        and optionally ``attention_mask``), or, without one, on text the base samples itself. Passing
        ``ovr_threshold`` alone fixes $C$ (rule ``"fixed"``); ``from_qwen(base, **DRAFT_INIT)`` gives the
        drafts' $\gamma = 10$, $C = 100$.
        """
        config_overrides = conversion_settings(config_overrides, calibration)
        if isinstance(base, (str, os.PathLike)):
            check_local_source(base, "base model")
            base_config = AutoConfig.from_pretrained(base)
            if base_config.model_type != "qwen2":
                raise ValueError(
                    f"base {str(base)!r} is a {base_config.model_type!r} model; CausalQwen needs a Qwen2 base"
                )
            check_qwen_base(base, base_config)
            if "num_token_id" not in config_overrides:
                config_overrides["num_token_id"] = num_token_id_from_tokenizer(base)
            base = Qwen2ForCausalLM.from_pretrained(base, use_safetensors=True)
        if not isinstance(base, Qwen2ForCausalLM):
            raise TypeError(
                f"base must be a transformers Qwen2ForCausalLM (or a path / hub id of one), got {type(base).__name__}"
            )
        if config_overrides.get("num_token_id") is None:
            raise ValueError(
                "from_qwen(instance) needs num_token_id: pass num_token_id=NumericTokenizer(tokenizer).num_token_id "
                "(= len(tokenizer) before <NUM> is added)"
            )
        config = config_from_base(base.config, config_overrides)  # every setting checked before the rule runs
        if config.ovr_threshold_init != "fixed":
            threshold = initial_threshold(
                base, config.ovr_threshold_init, config.ovr_threshold_quantile, calibration, config.num_token_id
            )
            config = CausalQwenConfig.from_dict({**config.to_dict(), "ovr_threshold": threshold})  # checked again
        # The three stages below take tens of seconds on a 0.5B base: a bar on stderr, switched like transformers' own.
        stages = tqdm(
            total=3, desc="conversion", unit="stage", disable=not transformers_logging.is_progress_bar_enabled()
        )
        with stages:
            stages.set_postfix_str("building the model")
            model = cls(config)
            stages.update()
            stages.set_postfix_str(f"casting to {str(base.dtype).removeprefix('torch.')}")
            model = model.to(base.dtype)
            stages.update()
            stages.set_postfix_str("copying the base's weights")
            copy_base_weights(base, model)
            stages.update()
        return model
