r"""Resizing the vocabulary, as transformers users do after adding tokens: ``model.resize_token_embeddings(len(tok))``.

CausalQwen's classes are its vocabulary: the decision head holds, per token $k$, one row of $W_{\mathrm{cls}}$, one
$b_k$ and, with a per-class threshold, one $C_k$. `get_output_embeddings` is the head's classification layer
(``action.classification_head``: $W_{\mathrm{cls}}$ ``[V, C]`` and $b_{\mathrm{cls}}$ ``[V]``, a copy of the base's
lm_head at conversion, never tied), so transformers' ``resize_token_embeddings`` resizes it as it resizes an lm_head:
the rows kept keep their values; with ``mean_resizing`` (transformers' default) new rows are drawn from the old rows'
mean and covariance and new biases are the old biases' mean, otherwise they are initialised as Qwen2 initialises a
linear layer. A per-class threshold follows (`causalqwen.decision.DecisionHead.resize_thresholds`): the classes kept
keep theirs, new ones start at ``config.ovr_threshold``. ``config.vocab_size`` becomes the new size, so the model's
door accepts the new ids and labels. ``<NUM>`` must stay a class, and the head must not be wrapped by peft's LoRA
(`causalqwen.integrations.lora.add_lora` trains copies of it that a resize would not reach): resize first.
"""

from __future__ import annotations

from torch import nn

from ..decision import DecisionHead

__all__ = ["VocabularyResizing"]


class VocabularyResizing:
    """transformers' output-embedding interface and ``resize_token_embeddings`` for `CausalQwenForCausalLM`."""

    def get_output_embeddings(self) -> nn.Linear:
        r"""The classification layer of the decision head, $W_{\mathrm{cls}}$ ``[V, C]`` with $b_{\mathrm{cls}}$."""
        return self.action.classification_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.action.classification_head = new_embeddings

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """transformers' ``resize_token_embeddings``, with the decision head's classes resized beside the token
        embedding (see the module). Returns the token embedding, as transformers' does."""
        num_token_id = self.config.num_token_id
        if not isinstance(self.action, DecisionHead):  # peft's ModulesToSaveWrapper (add_lora trains a copy of it)
            raise ValueError(
                "resize_token_embeddings cannot reach the decision head once LoRA adapters wrap it (peft keeps its "
                "own copies of the head in modules_to_save): resize before add_lora, or after merge_and_unload()"
            )
        if new_num_tokens is not None:
            if isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int):
                raise TypeError(f"new_num_tokens must be an int or None, got {type(new_num_tokens).__name__}")
            if new_num_tokens <= num_token_id:
                raise ValueError(
                    f"new_num_tokens={new_num_tokens} would drop <NUM> (id {num_token_id}): keep at least "
                    f"{num_token_id + 1} tokens"
                )
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.action.resize_thresholds(embeddings.weight.shape[0])
        return embeddings
