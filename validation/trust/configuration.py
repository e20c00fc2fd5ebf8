"""The configuration boundary: ``config.json`` fields and the model's and the training's settings.

A config that announces a model too large to allocate, a string where a boolean belongs, a float where an
integer belongs, a field missing, settings beyond ±1e30 or outside a backbone's range, optimisation settings
that wreck the weights, a field of the wrong type, a learning rate that diverges.
"""

from __future__ import annotations

from ..cases import TrustCase, WrongResult
from ..fixtures import fresh_tiny_model, load_config_fields, load_edited_config, train_tiny

__all__ = ["CASES"]


def _settings_extreme(**settings):
    def trigger():
        fresh_tiny_model(**settings)

    return trigger


def _training_settings(**settings):
    def trigger():
        from causalqwen.training import TrainingConfig

        TrainingConfig(**settings)

    return trigger


def _rope_theta_zero(config: dict) -> None:
    config["rope_parameters"]["rope_theta"] = 0


def _divergence():
    train_tiny(None, steps=6, learning_rate=1e30, weight_decay=0.0)  # no decay: 1e30 * 0.01 >= 1 is refused up front


def _training_diverged() -> type[Exception]:
    """`causalqwen.training.TrainingDiverged`, looked up when this table is built, so that the table also runs
    against a version of the package that does not have it (the row then expects `WrongResult`, and fails)."""
    try:
        from causalqwen.training import TrainingDiverged
    except ImportError:
        return WrongResult
    return TrainingDiverged


CASES = [
    # ---- security
    TrustCase(
        "config-huge-vocab",
        "security",
        "config.json announcing vocab_size = 10^12 beside the real weights",
        load_config_fields(vocab_size=10**12),
        ValueError,
        r"config\.json says vocab_size=1000000000000, hidden_size=\d+, but model\.embed_tokens\.weight",
    ),
    # ---- silent
    TrustCase(
        "config-detach-gate-string",
        "silent",
        'config.json with "detach_gate": "false" (loaded as true)',
        load_config_fields(detach_gate="false"),
        ValueError,
        r"config\.json: .*detach_gate must be true or false",
    ),
    TrustCase(
        "config-num-token-id-float",
        "silent",
        "config.json with num_token_id 1.5",
        load_config_fields(num_token_id=1.5),
        ValueError,
        r"config\.json: .*num_token_id must be an integer, got 1\.5",
    ),
    TrustCase(
        "config-threshold-overflows",
        "silent",
        "ovr_threshold = -3e38 (an infinite loss)",
        _settings_extreme(ovr_threshold=-3e38),
        ValueError,
        r"ovr_threshold must be a number in \[-1e\+30, 1e\+30\]",
    ),
    TrustCase(
        "config-noise-overflows",
        "silent",
        "noise_init = 3e38 (non-finite gradients)",
        _settings_extreme(noise_init=3e38),
        ValueError,
        r"noise_init must be a number in \[-1e\+30, 1e\+30\]",
    ),
    TrustCase(
        "config-without-num-token-id",
        "silent",
        "from_pretrained of a config.json without num_token_id (loaded)",
        load_edited_config(lambda config: config.pop("num_token_id")),
        ValueError,
        r"config\.json: config field num_token_id missing",
    ),
    TrustCase(
        "config-rms-norm-eps-negative",
        "silent",
        "config.json with rms_norm_eps -1.0 (every loc_S NaN, exit 0)",
        load_edited_config(lambda config: config.update(rms_norm_eps=-1.0)),
        ValueError,
        r"config\.json: .*rms_norm_eps must be a number in \(0, 1e\+30\]",
    ),
    TrustCase(
        "config-rope-theta-zero",
        "silent",
        "config.json with rope_theta 0 (loc_S silently changed)",
        load_edited_config(_rope_theta_zero),
        ValueError,
        r"config\.json: .*rope_theta must be a finite number in \(0",
    ),
    TrustCase(
        "weight-decay-1e300",
        "silent",
        "train --weight-decay 1e300 (exit 0, a model of inf and NaN written)",
        _training_settings(weight_decay=1e300),
        ValueError,
        r"weight_decay must be a finite number within float32's range",
    ),
    TrustCase(
        "decay-factor-below-0",
        "silent",
        "learning_rate 0.5 with weight_decay 2 (AdamW flips the weights' sign)",
        _training_settings(learning_rate=0.5, weight_decay=2.0),
        ValueError,
        r"learning_rate \* weight_decay must be < 1",
    ),
    # ---- clarity
    TrustCase(
        "config-field-wrong-type",
        "clarity",
        'config.json with "ovr_threshold": "100" (was a comparison TypeError)',
        load_config_fields(ovr_threshold="100"),
        ValueError,
        r"config\.json: config field ovr_threshold must be a number, got '100'",
    ),
    TrustCase(
        "learning-rate-1e30",
        "clarity",
        "training with learning rate 1e30 (surfaced as 'scale_U must be >= 0')",
        _divergence,
        _training_diverged(),
        r"training diverged .*lower the learning rate",
    ),
    TrustCase(
        "config-hidden-act-unknown",
        "clarity",
        'config.json with hidden_act "bogus" (KeyError)',
        load_edited_config(lambda config: config.update(hidden_act="bogus")),
        ValueError,
        r"config\.json: .*hidden_act must be one of .*got 'bogus'",
    ),
    TrustCase(
        "config-pad-token-beyond-vocab",
        "clarity",
        "config.json with pad_token_id 99999 (AssertionError)",
        load_edited_config(lambda config: config.update(pad_token_id=99999)),
        ValueError,
        r"config\.json: .*pad_token_id must be null or an id in \[0, vocab_size=\d+\), got 99999",
    ),
]
