"""Input checks, each at one public door: ``doors`` (the model's forward and generation inputs, one host
synchronisation), ``tokenizer_door`` (the tokenizer's arguments), ``values`` (the
shared value checks, a finite-parameter check of training).

``causalqwen.checks`` was once the module that ``values`` is now; its names are importable from here too."""

from .values import (
    TrainingDiverged,
    all_good,
    check_finite_parameters,
    check_positive_int,
    first_index,
)

__all__ = ["check_positive_int", "all_good", "first_index",
           "TrainingDiverged", "check_finite_parameters"]
