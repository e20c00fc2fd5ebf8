"""Shared test configuration: Hypothesis profiles and small fixtures.

Where a test lives (tests/test_layout.py checks the names): one folder, each file named by what it tests --

* ``test_<section>.py`` -- a section of the package (``causalqwen/<section>.py``: ``test_losses.py``);
* ``test_<sub-package>_<module>.py`` -- a module of the infrastructure (``causalqwen/<sub-package>/<module>.py``:
  ``test_files_rundir.py``, ``test_integrations_lora.py``, ``test_app_cli.py``, ``test_kernels_fused.py``);
* ``test_v<N>_<study>.py`` and ``test_validation*.py`` -- the validation studies (``validation/``);
* ``test_layout.py``, ``test_style.py``, ``test_packaging.py``, ``test_docs_site.py``, ``test_benchmarks.py``,
  ``test_cuda.py``, ``test_distributed.py``, ``test_fsdp.py`` -- checks of the whole project.

A test goes to the file of what it exercises: a refusal at a door with the section or module of that door, a file
the project writes or reads with the module that writes or reads it.

The tiny model's helpers that are not fixtures (its builder, its data, the short runs' settings) are in
``tiny_runs.py``, beside ``wall_clock.py``: a test module imports them by name, as a conftest cannot be.

Profiles (select with ``HYPOTHESIS_PROFILE=...``; the default is ``ci``):

* ``ci`` -- derandomized, so every run of the suite checks the same examples;
* ``dev`` -- random examples, a few more of them, for local exploration;
* ``thorough`` -- many examples, for a long run before a release.
"""

import contextlib
import copy
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", derandomize=True, max_examples=40, print_blob=True, **_common)
settings.register_profile("dev", max_examples=80, **_common)
settings.register_profile("thorough", max_examples=1000, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """The embedded tiny Qwen2 base saved to a directory (a ``--base`` for the command line)."""
    from causalqwen.app.tiny import save_tiny_base

    return save_tiny_base(tmp_path_factory.mktemp("qwen_tiny"))


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny Qwen2 base's tokenizer, wrapped: the tokenizer of every tiny CausalQwen built with ``seed=0``."""
    from causalqwen import NumericTokenizer
    from causalqwen.app.tiny import build_tiny_base

    return NumericTokenizer(build_tiny_base(seed=0)[1])


@pytest.fixture(scope="module")
def tiny():
    """``(model, tokenizer)``: the tiny CausalQwen built with ``seed=0`` and its new parameters drawn with
    ``init_seed=0``, and its tokenizer (the one of `tokenizer`)."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model, tokenizer


@pytest.fixture(scope="module")
def tiny_in_eval():
    """``(model, tokenizer)`` as `tiny` gives them, the model in eval mode: for the modules whose own ``tiny`` is
    another fixture."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model.eval(), tokenizer


def _biased(model, token_id):
    """A copy of ``model`` that chooses ``token_id`` at every step (in every mode)."""
    biased = copy.deepcopy(model)
    with torch.no_grad():
        biased.action.classification_head.bias[token_id] = 1e4
    return biased


@pytest.fixture(scope="module")
def models(tiny_in_eval):
    """The plain tiny model, one that writes the digit 7 at every step, and one that writes a number at every step."""
    model, tokenizer = tiny_in_eval
    seven = tokenizer.hf_tokenizer.convert_tokens_to_ids("7")
    return {"plain": model, "digits": _biased(model, seven), "numbers": _biased(model, model.config.num_token_id)}


@pytest.fixture(scope="module")
def saved(tokenizer, tmp_path_factory):
    """The tiny CausalQwen written by ``save_pretrained``: its directory."""
    from tiny_runs import tiny_model

    path = tmp_path_factory.mktemp("saved") / "model"
    tiny_model().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def finished_run(tiny, tmp_path_factory):
    """A two-step training run (preset all, with the divergence bound) with its checkpoint-2."""
    from tiny_runs import TWO_STEP_RUN, tiny_data, tiny_model

    from causalqwen import train
    from causalqwen.training import TrainingConfig

    out = tmp_path_factory.mktemp("runs") / "run"
    train(
        tiny_model(),
        tiny_data(tiny[1]),
        TrainingConfig(**TWO_STEP_RUN | {"max_u_divergence": 1.0}),
        out_dir=str(out),
        progress=False,
    )
    assert sorted(os.listdir(out / "checkpoint-2")) == [
        "causalqwen_auto.py",
        "checkpoint_files.json",
        "config.json",
        "divergence_bound.json",
        "divergence_reference.safetensors",
        "generation_config.json",
        "history.json",
        "model.safetensors",
        "trainer_state.json",
        "training_state.safetensors",
    ]
    return out


@pytest.fixture
def killed_after_first_save():
    """A context manager: inside it, ``runs.save_checkpoint`` writes its checkpoint and then raises
    ``KeyboardInterrupt`` (a run killed right after its first checkpoint), and the ``with`` expects that interrupt;
    on leaving it, saving is back to normal."""
    from causalqwen.app import runs

    @contextlib.contextmanager
    def killed():
        save = runs.save_checkpoint

        def save_then_die(*args, **kwargs):
            raise KeyboardInterrupt("killed after " + save(*args, **kwargs))

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runs, "save_checkpoint", save_then_die)
            with pytest.raises(KeyboardInterrupt):
                yield

    return killed


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests, as ``python -m validation`` runs the studies; restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
