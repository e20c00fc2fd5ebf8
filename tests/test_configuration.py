"""Executable specification of the configuration (causalqwen.configuration): every field checked once, when a config
is made or loaded.

The kinds of the Qwen2 backbone's fields are transformers' ``@strict`` type validation; CausalQwen's own fields'
kinds, every range, the backbone's sizes and rotary parameters are `CausalQwenConfig.__post_init__`'s. A nonsense
value in a saved ``config.json`` (or the CausalQwen ``mode`` of a saved ``generation_config.json``) is a
``ValueError`` naming the file and the field, raised before the model is built (never a model that loads and emits
NaN, never a raw ``KeyError`` / ``AssertionError``). The oracles are the ranges the spec gives (docs/decisions.md),
written out here, independent of the code's tables.

One set of defaults: a config made in code starts where ``from_qwen`` does (the oracle is a real conversion), and a
saved config keeps the scale and threshold it names; one that names none was written when the drafts' values
(gamma = 10, C = 100, rule "fixed") were the class defaults, and means them.
"""

import json
import math
import re
import shutil

import numpy as np
import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoConfig, Qwen2Config

from causalqwen import CausalQwenForCausalLM
from causalqwen.app.cli import main
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.configuration import (
    SETTING_LIMIT,
    CausalQwenConfig,
    conversion_settings,
)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


def _edited(saved_model, tmp_path, **fields):
    target = tmp_path / "model"
    shutil.copytree(saved_model, target)
    config = json.loads((target / "config.json").read_text())
    rope = fields.pop("rope", None)
    if rope is not None:
        fields["rope_parameters"] = config["rope_parameters"] | rope
    (target / "config.json").write_text(json.dumps(config | fields))
    return target


BAD_FIELDS = [
    (dict(rms_norm_eps=-1.0), "rms_norm_eps must be a number in (0, 1e+30], got -1.0"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps must be a number in (0, 1e+30], got 0.0"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps must be finite, got nan"),
    (dict(rms_norm_eps=-1), "rms_norm_eps"),  # an int where a float belongs: @strict's type check names it
    (dict(rope={"rope_theta": 0}), "rope_parameters.rope_theta must be a finite number in (0, 1e+30], got 0"),
    (dict(rope={"rope_theta": -5}), "rope_parameters.rope_theta must be a finite number in (0, 1e+30], got -5"),
    (dict(rope={"rope_theta": float("inf")}), "rope_parameters.rope_theta must be a finite number"),
    (
        dict(rope={"rope_type": "bogus"}),
        "rope_parameters.rope_type must be one of default, dynamic, linear, llama3, longrope",
    ),
    (dict(rope={"rope_type": "linear"}), "config field rope_parameters: Missing required keys"),  # no factor
    (dict(attention_dropout=1.0), "attention_dropout must be a number in [0, 1), got 1.0"),
    (dict(attention_dropout=-0.5), "attention_dropout must be a number in [0, 1), got -0.5"),
    (dict(initializer_range=-1.0), "initializer_range must be a number in [0, 1e+30], got -1.0"),
    (dict(pad_token_id=99999), "pad_token_id must be null or an id in [0, vocab_size=704), got 99999"),
    (dict(bos_token_id=-1), "bos_token_id must be null or an id in [0, vocab_size=704), got -1"),
    (dict(eos_token_id=[600, 704]), "eos_token_id must be null or an id in [0, vocab_size=704), got [600, 704]"),
    (dict(hidden_act="bogus"), "hidden_act must be one of "),
    (dict(num_attention_heads=0), "num_attention_heads must be a positive integer, got 0"),
    (dict(num_key_value_heads=0), "num_key_value_heads must be an integer in [1, num_attention_heads=4]"),
    (dict(num_attention_heads=3), "hidden_size (64) must be divisible by num_attention_heads (3)"),
    (dict(num_key_value_heads=8), "num_key_value_heads must be an integer in [1, num_attention_heads=4]"),
    (dict(num_key_value_heads=3), "num_attention_heads (4) must be divisible by num_key_value_heads (3)"),
    (dict(num_attention_heads=64), "hidden_size / num_attention_heads (64 / 64) must give an even head size"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer, got 0"),
    (dict(dtype="bogus"), "dtype must be one of float16, bfloat16, float32, float64, \"auto\" or null, got 'bogus'"),
    (dict(dtype="int8"), 'dtype must be one of float16, bfloat16, float32, float64, "auto" or null'),
    (
        dict(ovr_treshold=5.0),
        "config field 'ovr_treshold' is not a CausalQwenConfig field; did you mean 'ovr_threshold'?",
    ),
    (dict(abduction_scale_inti=1.0), "'abduction_scale_inti' is not a CausalQwenConfig field; did you mean"),
]


@pytest.mark.parametrize("fields, message", BAD_FIELDS)
def test_a_nonsense_backbone_field_is_refused_naming_file_and_field(saved_model, tmp_path, fields, message):
    target = _edited(saved_model, tmp_path, **fields)
    file = str(target / "config.json")
    for load in (CausalQwenConfig.from_pretrained, CausalQwenForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=rf"^{re.escape(file)}: .*{re.escape(message)}"):
            load(target)


def test_the_backbone_checks_apply_to_a_config_made_in_code():
    with pytest.raises(ValueError, match=r"^config field hidden_act must be one of .*silu.*, got 'bogus'$"):
        CausalQwenConfig(num_token_id=0, hidden_act="bogus")
    with pytest.raises(ValueError, match=r"^config field torch_dtype must be one of float16"):
        CausalQwenConfig(num_token_id=0, torch_dtype="bogus")
    with pytest.raises(ValueError, match=r"num_attention_heads \(32\) must be divisible by num_key_value_heads \(3\)"):
        CausalQwenConfig(num_token_id=0, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"rope_parameters\.rope_theta must be a finite number .* got -5\.0"):
        CausalQwenConfig(num_token_id=0, rope_theta=-5.0, rope_parameters=None)  # the legacy spelling too
    with pytest.raises(ValueError, match=r"^config field dtype must be one of .* got torch\.int8$"):
        CausalQwenConfig(num_token_id=0, dtype=torch.int8)


def test_a_misspelt_field_is_refused_in_code_and_any_other_extra_key_is_kept_as_transformers_keeps_it(
    saved_model, tmp_path
):
    """A near spelling of a field (difflib, cutoff 0.85) would be kept beside the real field and change nothing:
    refused, naming the field meant. A key near no field (a user's note, a newer library's) is kept."""
    with pytest.raises(ValueError, match=r"^config field 'num_token_ids' is not .*did you mean 'num_token_id'\?"):
        CausalQwenConfig(num_token_ids=3)
    config = CausalQwenConfig.from_pretrained(_edited(saved_model, tmp_path, dataset_note="prices, 2026"))
    assert config.dataset_note == "prices, 2026"


def test_a_field_in_another_letter_case_is_refused_naming_file_and_field(saved_model, tmp_path):
    """OVR_THRESHOLD is no field (names are case-sensitive): it was kept as an extra key and the threshold loaded as
    the file's other value, silently."""
    target = _edited(saved_model, tmp_path, OVR_THRESHOLD=3.0)
    message = (
        r"config\.json: config field 'OVR_THRESHOLD' is not a CausalQwenConfig field .*did you mean 'ovr_threshold'"
    )
    with pytest.raises(ValueError, match=message):
        CausalQwenConfig.from_pretrained(target)
    with pytest.raises(ValueError, match="did you mean 'gate_alpha'"):
        CausalQwenConfig(Gate_Alpha=0.5)


@pytest.mark.parametrize(
    "field, message",
    [
        ("abduction_scale_init", "abduction_scale_init must be a finite number, got an integer of 1329 bits"),
        ("ignore_index", "ignore_index must be an integer within 64 bits"),
        ("num_hidden_layers", "num_hidden_layers must be a positive integer"),
        ("rope_theta", "rope_parameters.rope_theta must be a finite number"),
    ],
)
def test_an_integer_of_401_digits_is_named_with_its_field_and_file(saved_model, tmp_path, field, message):
    """A 401-digit integer has no float (an unnamed OverflowError) nor int64."""
    fields = {"rope": {"rope_theta": 10**400}} if field == "rope_theta" else {field: 10**400}
    target = _edited(saved_model, tmp_path, **fields)
    with pytest.raises(ValueError, match=re.escape(f"{target / 'config.json'}: ") + ".*" + re.escape(message)):
        CausalQwenConfig.from_pretrained(target)


def test_a_field_set_after_construction_is_checked_before_the_model_uses_it():
    """model.config.gate_alpha = 5.0 changed the loss (65.92 to 90.00) unchecked; the checks of a config made with the
    value apply, the config keeps its value, and a sound value is taken as a config made with it takes it."""
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    model, batch = tiny.model, tiny.tokenizer(["The price is 12.5 yuan and 3 cups."])
    loss = model(**batch, labels=batch["input_ids"]).loss
    for field, value, error, message in [
        ("gate_alpha", 5.0, ValueError, "gate_alpha must be a number in [0, 1], got 5.0"),
        ("gate_alpha", math.nan, ValueError, "gate_alpha must be finite"),
        ("ovr_threshold", 1e31, ValueError, "ovr_threshold must be a number in [-1e+30, 1e+30]"),
        ("detach_gate", "yes", TypeError, "detach_gate must be true or false"),
        ("num_token_id", 10**6, ValueError, "num_token_id (1000000) must lie in"),
        ("loss_algorithm", "fast", ValueError, "loss_algorithm must be one of"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            setattr(model.config, field, value)
    assert model.config.gate_alpha == 0.0 and torch.equal(model(**batch, labels=batch["input_ids"]).loss, loss)
    model.config.gate_alpha = 1  # an integer real is stored as a float, as a config made with it stores it
    assert model.config.gate_alpha == 1.0 and isinstance(model.config.gate_alpha, float)
    model.config.update({"gate_alpha": 0.5, "regression_weight": 2})  # fields set together are checked together
    assert (model.config.gate_alpha, model.config.regression_weight) == (0.5, 2.0)


def test_save_pretrained_never_writes_a_config_its_loader_refuses(tmp_path):
    """A value changed in place (a NaN rotary base, set inside the dict where no assignment sees it) was written, and
    from_pretrained then refused the file."""
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    tiny.model.config.rope_parameters["rope_theta"] = math.nan
    for save, target in (
        (tiny.model.save_pretrained, tmp_path / "model"),
        (tiny.model.config.save_pretrained, tmp_path / "config"),
    ):
        with pytest.raises(ValueError, match=r"^save_pretrained: config\.json would not load back: .*rope_theta"):
            save(target)
        assert not target.exists() or not any(target.iterdir())
    with pytest.raises(ValueError, match="num_token_id missing"):
        CausalQwenConfig().save_pretrained(tmp_path / "no-num")


def test_sound_backbone_fields_still_load(saved_model, tmp_path):
    target = _edited(
        saved_model,
        tmp_path,
        dtype="auto",
        eos_token_id=[600, 601],
        pad_token_id=None,
        hidden_act="gelu",
        rope={"rope_theta": 5e5},
        attention_dropout=0.1,
        initializer_range=0.0,
    )
    config = CausalQwenConfig.from_pretrained(target)
    assert config.dtype is None and config.eos_token_id == [600, 601] and config.pad_token_id is None
    assert math.isclose(config.rope_parameters["rope_theta"], 5e5) and config.hidden_act == "gelu"
    assert CausalQwenConfig(num_token_id=0, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert CausalQwenConfig(num_token_id=0, torch_dtype="float16").dtype == torch.float16
    CausalQwenForCausalLM.from_pretrained(target)


@pytest.mark.parametrize(
    "fields",
    [
        dict(rms_norm_eps=-1.0),
        dict(pad_token_id=99999),
        dict(hidden_act="bogus"),
        dict(rope={"rope_type": "bogus"}),
        dict(num_attention_heads=0),
        dict(dtype="bogus"),
    ],
)
def test_the_cli_refuses_a_nonsense_backbone_field_with_exit_2_and_one_line(saved_model, tmp_path, capsys, fields):
    target = _edited(saved_model, tmp_path, **fields)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(target), "--prompt", "a 1"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    name = next(iter(fields)).replace("rope", "rope_parameters.rope_type")
    assert re.search(rf"config field {re.escape(name)}", lines[-1]) and "Traceback" not in "\n".join(lines)
    assert len([line for line in lines if line.startswith("causalqwen")]) == 1


# ----- generation_config.mode -----


def _with_mode(tmp_path, mode):
    model = build_tiny_causal_lm(seed=0, init_seed=0).model
    model.generation_config.mode = mode
    path = tmp_path / "model"
    model.save_pretrained(path)
    return model, path


def test_a_saved_generation_mode_survives_save_and_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    model, path = _with_mode(tmp_path, "causal")
    saved = json.loads((path / "generation_config.json").read_text())
    assert saved["mode"] == "causal" and saved["_from_model_config"] is False
    assert model.generation_config._from_model_config is True  # the model in memory is left as it was
    assert CausalQwenForCausalLM.from_pretrained(path).generation_config.mode == "causal"
    assert AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).generation_config.mode == "causal"


def test_a_mode_saved_beside_from_model_config_true_is_restored(tmp_path):
    _, path = _with_mode(tmp_path, "shared_noise")
    file = path / "generation_config.json"
    file.write_text(json.dumps(json.loads(file.read_text()) | {"_from_model_config": True}))  # what 0.x wrote
    assert CausalQwenForCausalLM.from_pretrained(path).generation_config.mode == "shared_noise"


def test_an_invalid_saved_generation_mode_is_refused_naming_file_and_field(tmp_path):
    from transformers import AutoModelForCausalLM

    _, path = _with_mode(tmp_path, "causal")
    file = path / "generation_config.json"
    for from_model_config in (False, True):
        file.write_text(
            json.dumps(json.loads(file.read_text()) | {"mode": "bogus", "_from_model_config": from_model_config})
        )
        message = (
            rf"^{re.escape(str(file))}: generation_config field mode must be one of standard, causal, .* got 'bogus'$"
        )
        with pytest.raises(ValueError, match=message):
            CausalQwenForCausalLM.from_pretrained(path)
        with pytest.raises(ValueError, match=message):
            AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)


def test_saving_an_invalid_generation_mode_is_refused_before_writing(tmp_path):
    model = build_tiny_causal_lm(seed=0, init_seed=0).model
    model.generation_config.mode = "bogus"
    with pytest.raises(ValueError, match=r"^generation_config field mode must be one of standard, .* got 'bogus'$"):
        model.save_pretrained(tmp_path / "model")
    assert not (tmp_path / "model").exists() or not any((tmp_path / "model").iterdir())


# ----- @strict's kind checks of the backbone, and CausalQwen's own -----


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", True),
        ("hidden_size", 64.0),
        ("use_cache", 1),
        ("rms_norm_eps", 1),
        ("eos_token_id", [1, True]),
        ("sliding_window", 1.5),
    ],
)
def test_strict_refuses_a_backbone_field_of_the_wrong_kind_naming_it(field, value):
    with pytest.raises(StrictDataclassError, match=rf"field '{field}'"):
        CausalQwenConfig(num_token_id=0, **{field: value})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("detach_gate", "false", r"^config field detach_gate must be true or false \(a JSON boolean\), got 'false'$"),
        ("learnable_threshold", 1, "^config field learnable_threshold must be true or false"),
        ("num_token_id", 1.5, r"^config field num_token_id must be an integer, got 1\.5$"),
        ("noise_init", True, "^config field noise_init must be a number, got True$"),
        ("ovr_threshold", "100", "^config field ovr_threshold must be a number, got '100'$"),
    ],
)
def test_a_causalqwen_field_of_the_wrong_kind_is_a_type_error_naming_it(field, value, message):
    with pytest.raises(TypeError, match=message):
        CausalQwenConfig(**{"num_token_id": 0, field: value})


def test_integer_reals_are_stored_as_floats():
    config = CausalQwenConfig(num_token_id=0, noise_init=1, ovr_threshold=-3, attention_dropout=0)
    assert (config.noise_init, config.ovr_threshold, config.attention_dropout) == (1.0, -3.0, 0.0)
    assert all(type(v) is float for v in (config.noise_init, config.ovr_threshold, config.attention_dropout))


# The ranges of the real-valued settings, as the spec states them (SETTING_LIMIT = 1e30 bounds the magnitudes).
REAL_RANGES = {
    "gate_alpha": lambda v: 0 <= v <= 1,
    "regression_weight": lambda v: 0 <= v <= 1e30,
    "abduction_scale_init": lambda v: 0 < v <= 1e30,
    "scale_eps": lambda v: 1e-30 <= v <= 1e30,
    "noise_init": lambda v: -1e30 <= v <= 1e30,
    "ovr_threshold": lambda v: -1e30 <= v <= 1e30,
    "rms_norm_eps": lambda v: 0 < v <= 1e30,
    "attention_dropout": lambda v: 0 <= v < 1,
}


@given(
    field=st.sampled_from(sorted(REAL_RANGES)),
    value=st.one_of(
        st.floats(allow_nan=False, allow_infinity=False, width=64),
        st.sampled_from([0.0, 1.0, 1e-30, 1e30, -1e30, 1.0000001e30, 0.9999999]),
    ),
)
def test_a_real_setting_is_accepted_exactly_inside_its_range(field, value):
    assert SETTING_LIMIT == 1e30
    if REAL_RANGES[field](value):
        assert getattr(CausalQwenConfig(num_token_id=0, **{field: value}), field) == value
    else:
        with pytest.raises(ValueError, match=rf"^config field {field} must be a number in "):
            CausalQwenConfig(num_token_id=0, **{field: value})


@given(field=st.sampled_from(sorted(REAL_RANGES)), value=st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_real_setting_that_is_not_finite_is_named_as_such(field, value):
    with pytest.raises(ValueError, match=rf"^config field {field} must be finite, got "):
        CausalQwenConfig(num_token_id=0, **{field: value})


@given(threshold=st.floats(min_value=-1e30, max_value=1e30))
def test_a_threshold_given_alone_fixes_it_and_a_rule_with_it_is_refused(threshold):
    """from_qwen's settings: ``ovr_threshold`` alone means the rule "fixed"; with a rule it is a conflict."""
    assert conversion_settings({"ovr_threshold": threshold}, None)["ovr_threshold_init"] == "fixed"
    with pytest.raises(ValueError, match="fixes the threshold"):
        conversion_settings({"ovr_threshold": threshold, "ovr_threshold_init": "top_two_midpoint"}, None)


# The drafts' scale and threshold, as the design drafts give them (what a config file without the fields means).
DRAFTS = {"abduction_scale_init": 10.0, "ovr_threshold": 100.0, "ovr_threshold_init": "fixed"}
TINY_SIZES = dict(
    vocab_size=40,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    num_token_id=39,
)


def _own_fields(config) -> dict:
    """Every field `CausalQwenConfig` adds to `Qwen2Config`, with its value in ``config``."""
    names = [name for name in CausalQwenConfig.__dataclass_fields__ if not hasattr(Qwen2Config(), name)]
    return {name: getattr(config, name) for name in names}


def test_a_config_made_in_code_starts_at_the_calibrated_scale_and_rule():
    config = CausalQwenConfig()
    assert (config.abduction_scale_init, config.ovr_threshold_init, config.ovr_threshold) == (
        0.1,
        "top_two_midpoint",
        0.0,
    )


def test_a_config_made_in_code_is_what_from_qwen_makes_of_a_base_whose_logits_are_all_zero():
    """Every CausalQwen field of ``CausalQwenConfig(sizes)`` equals ``from_qwen``'s; the threshold the rule computes
    for a base with a zero lm_head is the class default 0.0, and a model built from the config, with the base's
    weights copied, is the converted model, parameter for parameter and output for output."""
    from causalqwen.initialization import copy_base_weights

    base, tokenizer = build_tiny_base(seed=0)
    base.lm_head.weight = torch.nn.Parameter(torch.zeros_like(base.lm_head.weight))  # every logit 0, backbone kept
    torch.manual_seed(0)
    converted = CausalQwenForCausalLM.from_qwen(base, num_token_id=len(tokenizer))
    backbone = {
        name: getattr(converted.config, name)
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_parameters",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "num_token_id",
        )
    }
    config = CausalQwenConfig(**backbone, tie_word_embeddings=False)
    assert _own_fields(config) == _own_fields(converted.config)
    assert converted.config.ovr_threshold == 0.0
    torch.manual_seed(0)
    built = CausalQwenForCausalLM(config)
    copy_base_weights(base, built)
    expected, got = converted.state_dict(), built.state_dict()
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    ids = torch.tensor([[5, 17, len(tokenizer), 2, 9]])
    values = torch.tensor([[0.0, 0.0, 42.5, 0.0, 0.0]])
    for labels in (None, ids):  # the decisions' laws without labels, the losses with them
        with torch.no_grad():
            a = converted.eval()(input_ids=ids, numeric_values=values, labels=labels)
            b = built.eval()(input_ids=ids, numeric_values=values, labels=labels)
        assert a.keys() == b.keys()
        for field, tensor in a.items():
            if isinstance(tensor, torch.Tensor):
                assert torch.equal(tensor, b[field]), field


def _saved(tmp_path, **overrides):
    """A model built from ``CausalQwenConfig(TINY_SIZES, overrides)``, saved to ``tmp_path / "model"``."""
    model = CausalQwenForCausalLM(CausalQwenConfig(**TINY_SIZES, **overrides))
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.parametrize("overrides", [{}, DRAFTS, dict(abduction_scale_init=0.5, ovr_threshold=-3.25)])
def test_every_save_names_its_scale_and_threshold_and_loads_them_back(tmp_path, overrides):
    """The class defaults included: a file that names them does not depend on what the defaults are."""
    path = _saved(tmp_path, **overrides)
    written = json.loads((path / "config.json").read_text())
    expected = {name: CausalQwenConfig(**TINY_SIZES, **overrides).to_dict()[name] for name in DRAFTS}
    assert {name: written.get(name) for name in DRAFTS} == expected
    for load in (CausalQwenConfig.from_pretrained, AutoConfig.from_pretrained):
        assert {name: getattr(load(path), name) for name in DRAFTS} == expected


@pytest.mark.parametrize(
    "left_out", [tuple(DRAFTS), ("ovr_threshold_init",), ("abduction_scale_init",), ("ovr_threshold",)]
)
def test_a_saved_config_that_leaves_out_the_scale_or_threshold_means_the_drafts_value(tmp_path, left_out):
    """As the files written when the drafts' values were the class defaults. The loaded model decides with the
    threshold the file means (its scale_U comes from its saved weights), and a model built from the loaded config
    starts at the gamma the file means."""
    path = _saved(tmp_path, abduction_scale_init=0.5, ovr_threshold=-3.25, ovr_threshold_init="top_logit_quantile")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in left_out}))
    saved = {"abduction_scale_init": 0.5, "ovr_threshold": -3.25, "ovr_threshold_init": "top_logit_quantile"}
    expected = {name: DRAFTS[name] if name in left_out else saved[name] for name in DRAFTS}
    for load in (CausalQwenConfig.from_pretrained, AutoConfig.from_pretrained):
        assert {name: getattr(load(path), name) for name in DRAFTS} == expected
    model = CausalQwenForCausalLM.from_pretrained(path).eval()
    assert float(model.ovr_threshold) == expected["ovr_threshold"]
    with torch.no_grad():
        output = model(input_ids=torch.tensor([[5, 17, 3]]))
        rebuilt = CausalQwenForCausalLM(model.config).eval()(input_ids=torch.tensor([[5, 17, 3]]))
    torch.testing.assert_close(output.scale_U, torch.full_like(output.scale_U, 0.5))  # the saved weights' gamma
    torch.testing.assert_close(rebuilt.scale_U, torch.full_like(rebuilt.scale_U, expected["abduction_scale_init"]))


def test_a_keyword_at_load_wins_over_what_a_file_without_the_field_means(tmp_path):
    path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "abduction_scale_init"}))
    assert CausalQwenConfig.from_pretrained(path, abduction_scale_init=2.0).abduction_scale_init == 2.0


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("abduction_scale_init", None, TypeError, "config field abduction_scale_init must be a number, got None"),
        ("ovr_threshold", None, TypeError, "config field ovr_threshold must be a number, got None"),
        ("ovr_threshold", "100", TypeError, "config field ovr_threshold must be a number, got '100'"),
        ("ovr_threshold_init", None, ValueError, "config field ovr_threshold_init must be one of"),
        ("ovr_threshold_init", "calibrated", ValueError, "config field ovr_threshold_init must be one of"),
    ],
)
def test_a_null_or_foreign_scale_or_threshold_in_a_file_is_refused_naming_file_and_field(
    tmp_path, field, value, error, message
):
    """A null is not a left-out field: it is refused, never read as the drafts' value or the class default."""
    path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {field: value}))
    with pytest.raises(error, match=re.escape(message)) as caught:
        CausalQwenConfig.from_pretrained(path)
    assert str(caught.value).startswith(str(path / "config.json"))


# ---- one set of defaults: no section signature holds a default the config does not ----

# A parameter name of a section's function or class, mapped to the config field it is the value of. Where the
# function names it as the field does, the field's own name is here too.
PARAMETER_FIELDS = {
    "scale_init": "abduction_scale_init",
    "abduction_scale_init": "abduction_scale_init",
    "abduction_type": "abduction_type",
    "mlp_size": "abduction_mlp_size",
    "abduction_mlp_size": "abduction_mlp_size",
    "noise_init": "noise_init",
    "threshold": "ovr_threshold",
    "ovr_threshold": "ovr_threshold",
    "rule": "ovr_threshold_init",
    "ovr_threshold_init": "ovr_threshold_init",
    "quantile": "ovr_threshold_quantile",
    "ovr_threshold_quantile": "ovr_threshold_quantile",
    "ovr_threshold_per_class": "ovr_threshold_per_class",
    "learnable_threshold": "learnable_threshold",
    "regression_weight": "regression_weight",
    "alpha": "gate_alpha",
    "gate_alpha": "gate_alpha",
    "detach_gate": "detach_gate",
    "scale_eps": "scale_eps",
    "ignore_index": "ignore_index",
    "num_token_id": "num_token_id",
    "causal_size": "causal_size",
    "loss_algorithm": "loss_algorithm",
}


def _sections() -> list[str]:
    """The design's sections (``causalqwen/*.py``) and the kernels, the fast paths of the loss."""
    from pathlib import Path

    import causalqwen

    root = Path(causalqwen.__file__).parent
    sections = [f"causalqwen.{path.stem}" for path in sorted(root.glob("*.py")) if path.stem != "__init__"]
    return sections + [f"causalqwen.kernels.{path.stem}" for path in sorted((root / "kernels").glob("[!_]*.py"))]


def _public_signatures(module):
    """(qualified name, signature) of every public function and class a module defines, and of each class's
    ``__init__`` and public methods."""
    import inspect

    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            yield name, inspect.signature(value)
        elif inspect.isclass(value) and value is not CausalQwenConfig:
            members = {"__init__": vars(value)["__init__"]} if "__init__" in vars(value) else {}
            members |= {k: v for k, v in vars(value).items() if not k.startswith("_")}
            for member, function in members.items():
                function = getattr(function, "__func__", function)  # a classmethod's or staticmethod's function
                if inspect.isfunction(function):
                    yield f"{name}.{member}", inspect.signature(function)


def test_no_section_signature_holds_a_default_the_config_does_not():
    """A section's function or class that takes a config field's value (`PARAMETER_FIELDS`) either has no default for
    it or has the config's class default: the drafts' values live in `causalqwen.initialization.DRAFT_INIT` alone,
    and a signature never starts somewhere else than a config (``AbductionNetwork(scale_init=10.0)`` beside
    ``abduction_scale_init = 0.1`` did). ``None`` (an argument left out) is not a value."""
    import importlib
    import inspect

    differing = []
    for section in _sections():
        for name, signature in _public_signatures(importlib.import_module(section)):
            for parameter in signature.parameters.values():
                field = PARAMETER_FIELDS.get(parameter.name)
                default = parameter.default
                if field is None or default is inspect.Parameter.empty or default is None:
                    continue
                expected = getattr(CausalQwenConfig, field)
                if type(default) is not type(expected) or default != expected:
                    differing.append(f"{section}.{name}({parameter.name}={default!r}), config.{field} = {expected!r}")
    assert differing == []


@pytest.fixture(scope="module")
def saved_tiny(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny[0].save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "removed",
    ["num_token_id", "hidden_size", "vocab_size", "num_hidden_layers", "num_key_value_heads", "rope_parameters"],
)
def test_a_config_without_a_required_field_is_refused_naming_file_and_field(saved_tiny, tmp_path, removed):
    from transformers import AutoConfig

    target = tmp_path / "model"
    shutil.copytree(saved_tiny, target)
    config = json.loads((target / "config.json").read_text())
    del config[removed]
    (target / "config.json").write_text(json.dumps(config))
    field = "rope_parameters or rope_theta" if removed == "rope_parameters" else removed
    file = str(target / "config.json")
    for load in (
        CausalQwenConfig.from_pretrained,
        CausalQwenForCausalLM.from_pretrained,
        lambda path: CausalQwenConfig.from_json_file(path / "config.json"),
    ):
        with pytest.raises(ValueError, match=rf"^{file}: config field {field} missing \(or null\)"):
            load(target)
    with pytest.raises(
        ValueError, match=rf"^config field {field} missing"
    ):  # AutoConfig never tells the class the file
        AutoConfig.from_pretrained(target)


def test_a_null_num_token_id_is_refused_and_a_keyword_may_supply_it(saved_tiny, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(saved_tiny, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"num_token_id": None}))
    with pytest.raises(ValueError, match=r"config\.json: config field num_token_id missing \(or null\)"):
        CausalQwenConfig.from_pretrained(target)
    assert (
        CausalQwenConfig.from_pretrained(target, num_token_id=config["num_token_id"]).num_token_id
        == config["num_token_id"]
    )
    legacy = {k: v for k, v in config.items() if k != "rope_parameters"} | {"rope_theta": 5e5}
    (target / "config.json").write_text(json.dumps(legacy))  # the older spelling of the rotary base
    assert math.isclose(CausalQwenConfig.from_pretrained(target).rope_parameters["rope_theta"], 5e5)
    assert (
        CausalQwenConfig.from_pretrained(saved_tiny).to_dict()
        == CausalQwenConfig.from_dict(json.loads((saved_tiny / "config.json").read_text())).to_dict()
    )
    np.testing.assert_equal(CausalQwenConfig.from_pretrained(saved_tiny).num_token_id, config["num_token_id"])


def test_the_loss_algorithm_is_a_named_config_choice():
    from causalqwen import CausalQwenConfig

    with pytest.raises(ValueError, match="config field loss_algorithm must be one of fused, literal, got 'fast'"):
        CausalQwenConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, loss_algorithm="fast")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("number_encoding", "log_fourier", "number_encoding is 'log_fourier' and number_periods"),
        ("intermediate_size", 32, "model.layers.0.mlp"),
        ("vocab_size", 700, "is shape [704] in the model but shape [700] in a model built from its config"),
    ],
)
def test_save_pretrained_refuses_a_config_that_no_longer_describes_the_weights(tmp_path, field, value, message):
    """A field that fixes a module's shape, set on a built model, passed the config's checks and was saved: the
    directory then failed to load (``number_encoding="log_fourier"``: missing ``w_fourier``). The save names the
    field or the tensor and writes nothing; a model resized the way that changes its weights too still saves."""
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    setattr(tiny.model.config, field, value)
    target = tmp_path / "model"
    with pytest.raises(
        ValueError, match=r"^save_pretrained: the config no longer describes the weights: .*" + re.escape(message)
    ):
        tiny.model.save_pretrained(target)
    assert not target.exists() or not any(target.iterdir())


def test_save_pretrained_names_changed_periods_and_keeps_a_resized_model(tmp_path):
    config = build_tiny_causal_lm(seed=0, init_seed=0).model.config.to_dict()
    config.update(number_encoding="log_fourier", number_periods=[2.0, 4.0])
    model = CausalQwenForCausalLM(CausalQwenConfig(**config))
    model.config.number_periods = [2.0, 8.0]  # the same shapes, other periods: the weights were learnt for 2 and 4
    with pytest.raises(
        ValueError, match=r"number_periods \[2\.0, 8\.0\], but the numerical embedding .* \[2\.0, 4\.0\]"
    ):
        model.save_pretrained(tmp_path / "periods")
    model.config.number_periods = [2.0, 4.0]
    model.resize_token_embeddings(model.config.vocab_size + 8)
    model.save_pretrained(tmp_path / "resized")
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path / "resized")
    assert list(loaded.numerical_embedding.periods) == [2.0, 4.0]
    assert loaded.config.vocab_size == model.config.vocab_size


def test_save_pretrained_of_a_model_with_an_injected_adapter_says_to_save_the_adapter_or_merge(tmp_path):
    """peft's layers injected into the model's own modules: the base's save wrote ``q_proj.base_layer`` names that
    its loader then refused (q_proj missing); now the save refuses, says why, and writes nothing; merged, it saves."""
    from peft import LoraConfig, get_peft_model

    model = build_tiny_causal_lm(seed=0, init_seed=0).model
    adapted = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match=r"q_proj\.base_layer\..* an adapter was injected into the model \(save the"):
        adapted.base_model.model.save_pretrained(tmp_path / "injected")
    assert not (tmp_path / "injected").exists() or not any((tmp_path / "injected").iterdir())
    adapted.merge_and_unload().save_pretrained(tmp_path / "merged")
    assert CausalQwenForCausalLM.from_pretrained(tmp_path / "merged").config.vocab_size == model.config.vocab_size
