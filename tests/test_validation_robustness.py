"""The robustness suite: bad inputs fail clearly, tampered checkpoints are refused, extreme but finite inputs
stay finite through forward, loss and backward, and every trust-boundary case holds.

The cases are data in ``validation/`` (``bad_inputs``, ``tampered_checkpoints``, ``extreme_inputs``,
``trust/``; gathered by ``validation.robustness``, whose report runs the same tables);
here every bad-input and checkpoint case is a test of its own, and Hypothesis draws the extreme inputs.
"""

import math
import os
import re

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from validation import cases, trust
from validation.bad_inputs import BAD_INPUT_CASES
from validation.cases import (
    COMPONENTS,
    BadInputCase,
    CommandLineExit,
    run_case,
    run_cli,
)
from validation.extreme_inputs import (
    FLOAT32_DENORMAL,
    FLOAT32_MAX,
    FLOAT32_TINY,
    LABEL_PATTERNS,
    LOC_MAGNITUDES,
    MASK_PATTERNS,
    MODEL_CASE_CHOICES,
    NUMBER_MAGNITUDES,
    THRESHOLDS,
    LossCase,
    ModelCase,
    fuzz_model,
    run_loss_case,
    run_model_case,
)
from validation.fixtures import (
    quiet_transformers,
    scratch_dir,
    shared_tiny,
    short_prompt,
)
from validation.real_text import REAL_TEXT_CASES
from validation.robustness import run_suite
from validation.tampered_checkpoints import (
    CHECKPOINT_CASES,
    intact_checkpoint_round_trip,
    saved_checkpoint,
    tampered_checkpoint,
)

# ---------------------------------------------------------------------------------------------
# The bad-input table
# ---------------------------------------------------------------------------------------------


def _assert_raises_as_listed(case: BadInputCase) -> None:
    with pytest.raises(Exception) as raised:
        case.trigger()
    error = raised.value
    assert type(error) is case.error, f"{case.id}: expected {case.error.__name__}, got {type(error).__name__}: {error}"
    assert re.search(case.message, str(error)), f"{case.id}: message {str(error)!r} does not match {case.message!r}"


@pytest.mark.parametrize("case", BAD_INPUT_CASES, ids=lambda case: case.id)
def test_bad_input_raises_its_clear_error(case):
    _assert_raises_as_listed(case)


ALL_TRUST_CASES = trust.TRUST_CASES


@pytest.mark.parametrize("case", ALL_TRUST_CASES, ids=lambda case: case.id)
def test_trust_boundary_case_holds(case):
    outcome = cases.run_trust_case(case)
    assert outcome.passed, f"{case.id}: {outcome.actual}"


def test_the_trust_tables_are_one_per_boundary_with_the_kind_a_column():
    names = [boundary.name for boundary in trust.BOUNDARIES]
    assert names == [
        "configuration",
        "files and checkpoints",
        "run directories",
        "model inputs",
        "generation",
        "tokenizer and text",
        "adapters",
        "command line",
    ]
    assert all(boundary.cases for boundary in trust.BOUNDARIES), "every boundary has rows"
    assert ALL_TRUST_CASES == [case for boundary in trust.BOUNDARIES for case in boundary.cases]
    assert len(ALL_TRUST_CASES) == 102  # the rows of the tables before they were split by boundary
    ids = [case.id for case in ALL_TRUST_CASES]
    assert len(ids) == len(set(ids))
    assert cases.KINDS == ("security", "silent", "clarity")
    for kind in cases.KINDS:
        assert sum(case.kind == kind for case in ALL_TRUST_CASES) >= 8, kind
    assert all(case.kind in cases.KINDS for case in ALL_TRUST_CASES)
    assert all(case.error is None or re.compile(case.message) for case in ALL_TRUST_CASES)
    with pytest.raises(ValueError, match=r"trust case 'x': kind must be one of security, silent, clarity, got 'silly'"):
        cases.TrustCase("x", "silly", "x", lambda: None, None)
    must_fail = cases.TrustCase("x", "silent", "x", lambda: None, ValueError, "")
    assert not cases.run_trust_case(must_fail).passed  # no error where one is expected
    wrong = cases.TrustCase("x", "silent", "x", lambda: (_ for _ in ()).throw(cases.WrongResult("no")), None)
    assert not cases.run_trust_case(wrong).passed


def test_the_report_shows_the_trust_cases_one_table_per_boundary():
    from validation.robustness import _trust_markdown

    outcomes = [cases.TrustOutcome(case, case.id != "lock-symlink", "ran") for case in ALL_TRUST_CASES]
    markdown = "\n".join(_trust_markdown(outcomes))
    headings = [markdown.index(f"#### {boundary.name.capitalize()}: ") for boundary in trust.BOUNDARIES]
    assert headings == sorted(headings)
    for boundary, start, end in zip(trust.BOUNDARIES, headings, headings[1:] + [len(markdown)]):
        section = markdown[start:end]
        assert section.count("\n| `") == len(boundary.cases), boundary.name
        for case in boundary.cases:
            assert f"| `{case.id}` | {case.kind} |" in section, case.id
    assert "**FAIL** · 101 of 102 cases (security 19 of 20, silent 48 of 48, clarity 34 of 34)" in markdown
    assert "13 of 14 cases (security 6 of 7, silent 5 of 5, clarity 2 of 2)" in markdown  # run directories
    assert "4 of 4 cases (silent 4 of 4)" in markdown  # adapters: only the kinds it has
    stray = cases.TrustOutcome(cases.TrustCase("stray", "silent", "x", lambda: None, None), True, "ran")
    with pytest.raises(ValueError, match=r"in no boundary of validation\.trust\.BOUNDARIES: \['stray'\]"):
        _trust_markdown(outcomes + [stray])


def test_the_table_covers_every_component_with_at_least_15_kinds():
    ids = [case.id for case in BAD_INPUT_CASES + CHECKPOINT_CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert len(BAD_INPUT_CASES) >= 15
    for component in COMPONENTS:
        assert sum(case.component == component for case in BAD_INPUT_CASES) >= 2, component
    for case in BAD_INPUT_CASES + CHECKPOINT_CASES:
        assert case.component in COMPONENTS + ("checkpoint",), case.id
        assert issubclass(case.error, Exception) and case.error is not Exception, case.id
        re.compile(case.message)


def test_run_case_accepts_only_the_exact_type_and_a_matching_message():
    def raise_(error):
        raise error

    listed = BadInputCase(
        "x", "model", "x", lambda: raise_(ValueError("width must be 3")), ValueError, r"width must be \d"
    )
    assert run_case(listed).passed
    assert run_case(BadInputCase("x", "model", "x", listed.trigger, ValueError, "height")).passed is False
    subclass = BadInputCase("x", "model", "x", lambda: raise_(UnicodeError("width must be 3")), ValueError, "width")
    assert run_case(subclass).passed is False  # a subclass is not the listed type
    silent = run_case(BadInputCase("x", "model", "x", lambda: None, ValueError, ""))
    assert silent.passed is False and silent.actual == "no error raised"


def test_run_cli_reports_the_exit_status_and_the_error_line():
    with pytest.raises(CommandLineExit, match=r"^exit status 2: .*invalid choice: 'no-such-command'"):
        run_cli(["no-such-command"])


# ---- regression tests for the package changes the table forced (each was an unclear error before) ----


def test_float64_numeric_values_at_the_float32_boundary():
    """Values that float32 holds are accepted whatever the input dtype; beyond it, a clear error (it used to
    surface as 'scale must be > 0 ... nan' from deep inside the action network)."""
    model = shared_tiny().model
    ids, _ = short_prompt()
    largest = torch.tensor([[0.0, FLOAT32_MAX, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        out = model(ids, numeric_values=largest)
    assert bool(torch.isfinite(out.loc_S).all())
    beyond = torch.tensor([[0.0, -2.0 * FLOAT32_MAX, 0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"numeric_values must be representable in float32.*\[0, 1\]"):
        model(ids, numeric_values=beyond)
    with pytest.raises(ValueError, match="numeric_labels must be representable in float32"):
        model(ids, labels=ids, numeric_labels=beyond)


def test_a_non_finite_numeric_target_anywhere_is_an_error_not_a_nan_gradient():
    """Before: a NaN target at an unscored position gave a finite loss but NaN gradients (0 * NaN in backward)."""
    from causalqwen.action import ActionNetwork
    from causalqwen.kernels.fused import fused_loss

    action = ActionNetwork(4, 6)
    targets = torch.tensor([[1.0, math.inf, 0.0]])
    with pytest.raises(ValueError, match=r"numeric_targets must be finite: found inf at position \[0, 1\]"):
        fused_loss(
            action,
            torch.zeros(1, 3, 4),
            torch.ones(1, 3, 4),
            torch.tensor([[3, 1, 2]]),
            targets,
            num_token_id=3,
            detach_gate=False,
            threshold=100.0,
        )


def test_a_zero_scale_is_still_clamped_but_a_negative_one_is_refused():
    """D10's clamp stays for zero spreads (b_noise = 0 in causal mode); only an impossible scale is an error."""
    action = shared_tiny().model.action
    decision = action.decide(torch.zeros(1, 64), torch.zeros(1, 64))
    assert bool((decision.scale_S >= action.scale_eps).all()) and bool(torch.isfinite(decision.loc_S).all())
    with pytest.raises(ValueError, match="scale must be >= 0 everywhere"):
        action.decide(torch.zeros(1, 64), torch.full((1, 64), math.nan))


# ---------------------------------------------------------------------------------------------
# Tampered checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CHECKPOINT_CASES, ids=lambda case: case.id)
def test_a_tampered_checkpoint_is_refused(case):
    _assert_raises_as_listed(case)


def test_the_intact_checkpoint_loads_completely():
    assert intact_checkpoint_round_trip()
    from causalqwen import CausalQwenForCausalLM

    model, info = CausalQwenForCausalLM.from_pretrained(saved_checkpoint(), output_loading_info=True)
    assert isinstance(model, CausalQwenForCausalLM)
    assert not any(info.values()), info


def test_ignore_mismatched_sizes_is_the_one_explicit_way_to_accept_a_reinitialised_tensor():
    from causalqwen import CausalQwenForCausalLM

    with quiet_transformers():
        model = CausalQwenForCausalLM.from_pretrained(
            tampered_checkpoint("reshaped-tensor"), ignore_mismatched_sizes=True
        )
    assert model.action.b_noise.shape == (64,)
    assert bool(
        (model.action.b_noise == model.config.noise_init).all()
    )  # re-initialised (to its init value), as transformers documents
    saved = shared_tiny().model.state_dict()
    for name, tensor in model.state_dict().items():
        if name != "action.b_noise":
            assert torch.equal(tensor, saved[name]), name  # everything else is the checkpoint's


def test_a_truncated_shard_of_a_sharded_checkpoint_is_named(tmp_path):
    from causalqwen import CausalQwenForCausalLM

    with quiet_transformers():
        shared_tiny().model.save_pretrained(tmp_path, max_shard_size="200KB")
    shards = sorted(name for name in os.listdir(tmp_path) if name.endswith(".safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    with quiet_transformers():
        assert isinstance(CausalQwenForCausalLM.from_pretrained(tmp_path), CausalQwenForCausalLM)
    broken = tmp_path / shards[-1]
    broken.write_bytes(broken.read_bytes()[:-8])
    with pytest.raises(OSError, match=rf"the safetensors file '.*{re.escape(shards[-1])}' cannot be read"):
        CausalQwenForCausalLM.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# Extreme but finite inputs: no NaN or ±inf in the loss or any gradient
# ---------------------------------------------------------------------------------------------

_float32 = st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32, allow_nan=False, allow_infinity=False)
_extreme_number = st.one_of(
    st.builds(lambda m, s: m * s, st.sampled_from(NUMBER_MAGNITUDES), st.sampled_from((-1.0, 1.0))),
    _float32,  # Hypothesis' float32s include denormals, the largest finite value and ±0
)
_six_numbers = st.tuples(*[_extreme_number] * 6)

model_cases = st.builds(
    ModelCase,
    values=_six_numbers,
    targets=_six_numbers,
    **{field: st.sampled_from(choices) for field, choices in MODEL_CASE_CHOICES.items()},
)

_MAX = FLOAT32_MAX
_WORST_VALUES = (_MAX, -_MAX, FLOAT32_DENORMAL, -FLOAT32_TINY, 0.0, 3e38)


@given(case=model_cases)
@example(
    case=ModelCase(
        _WORST_VALUES,
        tuple(-v for v in _WORST_VALUES),
        1e30,
        "scale_eps",
        0.0,
        "full",
        "extreme_numeric_labels",
        "fused",
    )
)
@example(case=ModelCase(_WORST_VALUES, _WORST_VALUES, 1e30, "scale_eps", 0.0, "left_padded", "next_tokens", "literal"))
@example(
    case=ModelCase(_WORST_VALUES, _WORST_VALUES, 1e30, "large", 0.1, "one_row_all_padding", "some_ignored", "fused")
)
@example(case=ModelCase((0.0,) * 6, (0.0,) * 6, 1.0, "init", 0.1, "all_padding", "next_tokens", "fused"))
@example(case=ModelCase(_WORST_VALUES, _WORST_VALUES, 1e20, "scale_eps", 1e-6, "none", "all_ignored", "literal"))
def test_model_forward_loss_backward_stay_finite_on_extreme_inputs(case):
    check = run_model_case(case)
    assert check.ok, f"non-finite: {check.non_finite}"


def test_the_extreme_model_cases_do_reach_the_claimed_extremes():
    """|loc_U| ~ 1e30 and decision scales at scale_eps are actually reached, not just asked for."""
    check = run_model_case(
        ModelCase(_WORST_VALUES, _WORST_VALUES, 1e30, "scale_eps", 0.0, "full", "next_tokens", "fused")
    )
    assert check.ok and check.max_abs_loc >= 1e30 and check.min_scale == pytest.approx(1e-6)


def test_the_finite_check_does_see_a_nan():
    """A negative control: a NaN planted in the classification bias must be reported."""
    _, pristine = fuzz_model()
    bias = pristine["action.classification_head.bias"]
    saved = bias.clone()
    try:
        bias[0] = math.nan
        check = run_model_case(ModelCase((1.0,) * 6, (1.0,) * 6, 1.0, "init", 0.1, "full", "next_tokens", "fused"))
    finally:
        bias.copy_(saved)
    assert "loss" in check.non_finite and "grad of action.classification_head.bias" in check.non_finite


_magnitude_subsets = lambda choices: st.lists(st.sampled_from(choices), min_size=1, unique=True).map(  # noqa: E731
    lambda values: tuple(sorted(values))
)

loss_cases = st.builds(
    LossCase,
    seed=st.integers(0, 2**31 - 1),
    loc_magnitudes=_magnitude_subsets(LOC_MAGNITUDES),
    scale_at_eps=st.booleans(),
    threshold=st.sampled_from(THRESHOLDS),
    target_magnitudes=_magnitude_subsets(NUMBER_MAGNITUDES),
    labels=st.sampled_from(LABEL_PATTERNS[:3]),
    mask=st.sampled_from(MASK_PATTERNS),
)


@given(case=loss_cases)
@example(case=LossCase(0, (1e30,), True, -1e30, (FLOAT32_MAX,), "next_tokens", "full"))
@example(case=LossCase(1, (1e30,), True, 1e30, (FLOAT32_DENORMAL, FLOAT32_MAX), "next_tokens", "none"))
@example(case=LossCase(2, (0.0, 1e30), True, 0.0, (0.0,), "all_ignored", "all_padding"))
@example(case=LossCase(3, (1e-30, 1e30), False, 100.0, (3e38,), "some_ignored", "one_row_all_padding"))
def test_losses_stay_finite_on_extreme_locations_and_scales(case):
    check = run_loss_case(case)
    assert check.ok, f"non-finite: {check.non_finite}"


# ---------------------------------------------------------------------------------------------
# The report's summary
# ---------------------------------------------------------------------------------------------


def test_summary_runs_the_tables_and_a_fuzz_sample_and_reports_every_row():
    result = run_suite(model_examples=3, loss_examples=3)
    assert result.passed, result.markdown
    markdown = result.markdown
    for case in BAD_INPUT_CASES + CHECKPOINT_CASES + ALL_TRUST_CASES:
        assert f"`{case.id}`" in markdown
    # every row, plus the headline, the control, the 2 fuzz rows, the trust table's headline, and the real-text
    # table's headline and rows
    assert markdown.count("**PASS**") == (
        len(BAD_INPUT_CASES) + len(CHECKPOINT_CASES) + len(ALL_TRUST_CASES) + 5 + 1 + len(REAL_TEXT_CASES)
    )
    assert "### Real text survives tokenization" in markdown
    assert "### Security: what the project reads, and what it refuses" in markdown
    assert f"{len(ALL_TRUST_CASES)} of {len(ALL_TRUST_CASES)} trust-boundary cases hold" in markdown
    for boundary in trust.BOUNDARIES:
        assert f"#### {boundary.name.capitalize()}: {boundary.crosses}" in markdown
    assert "**FAIL**" not in markdown
    assert f"{len(BAD_INPUT_CASES)} of {len(BAD_INPUT_CASES)} bad inputs give their clear error" in markdown
    assert "0 of 6 extreme inputs left a NaN or ±inf" in markdown
    assert scratch_dir() not in markdown  # temporary paths are written DIR
