"""What transformers' `Trainer` reads from `CausalQwenForCausalLM`: its label names.

`Trainer` takes for a label every parameter of the model's ``forward`` whose name contains ``"label"``
(``transformers.utils.find_labels``, unless ``TrainingArguments.label_names`` says otherwise), and in evaluation
computes a loss only for a batch that holds *every* label (``prediction_step``'s ``has_labels``). ``forward``'s
``numeric_labels`` is optional -- without it the loss takes the values of ``numeric_values`` -- so a batch of
``input_ids``, ``numeric_values``, ``attention_mask`` and ``labels`` (the plain recipe, with transformers'
``default_data_collator``) has all the model needs, yet had no ``eval_loss``.

The model therefore declares its required labels the one way `Trainer` reads them: the signature it shows
(``forward.__signature__``, which `inspect.signature` returns, set by the class decorator `labels_for_trainer`) leaves
out the optional ``numeric_labels``, so `Trainer` finds ``["labels"]``. The function itself is unchanged:
``numeric_labels`` is still its fifth positional parameter and a keyword, for every caller. Two consequences, written in
docs/training.md: the numeric targets reach ``compute_metrics`` through the model's output
(``CausalQwenOutput.numeric_labels``) instead of the labels; and a ``numeric_labels`` *column* of a ``datasets.Dataset``
is one `Trainer` drops with ``remove_unused_columns=True`` (its default), so such a dataset needs
``remove_unused_columns=False`` (or ``label_names=["labels", "numeric_labels"]``). A collator that adds
``numeric_labels`` (`causalqwen.files.data.collate`) is not affected: columns are removed before collation.
"""

from __future__ import annotations

import inspect

__all__ = ["TRAINER_LABEL_NAMES", "OPTIONAL_LABELS", "labels_for_trainer", "signature_for_trainer"]

# The labels a batch must hold for the model to compute its loss: what Trainer should find.
TRAINER_LABEL_NAMES = ("labels",)
# forward's label parameters that have a default inside the model (numeric_labels: numeric_values).
OPTIONAL_LABELS = ("numeric_labels",)


def signature_for_trainer(forward) -> inspect.Signature:
    """The signature of ``forward`` without its `OPTIONAL_LABELS`, so that ``transformers.utils.find_labels`` finds
    `TRAINER_LABEL_NAMES`; a ``TypeError`` when ``forward`` has no such parameters (nothing to declare)."""
    signature = inspect.signature(forward)
    if not set(OPTIONAL_LABELS) <= set(signature.parameters):
        raise TypeError(f"{getattr(forward, '__qualname__', forward)!r} has no parameter {', '.join(OPTIONAL_LABELS)}")
    kept = [parameter for name, parameter in signature.parameters.items() if name not in OPTIONAL_LABELS]
    return signature.replace(parameters=kept)


def labels_for_trainer(cls: type) -> type:
    """A class decorator: ``cls.forward`` shows `Trainer` the signature of `signature_for_trainer` (the function itself
    is unchanged)."""
    cls.forward.__signature__ = signature_for_trainer(cls.forward)
    return cls
