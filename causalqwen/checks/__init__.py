"""Input checks, each at one public door: ``doors`` (the model's forward and generation inputs, one host
synchronisation), ``tokenizer_door`` (the tokenizer's arguments), ``values`` (masks, labels, thresholds, the
shared value checks, a finite-parameter check of training).

``causalqwen.checks`` was once the module that ``values`` is now; its names are importable from here too."""

from .values import (
    TrainingDiverged,
    all_good,
    as_bool_mask,
    check_finite_parameters,
    check_labels,
    check_positive_int,
    check_threshold,
    first_index,
)

__all__ = ["as_bool_mask", "check_threshold", "check_labels", "check_positive_int", "all_good", "first_index",
           "TrainingDiverged", "check_finite_parameters"]
