"""The Auto classes (`causalqwen.integrations.auto_registration`): ``import causalqwen`` lets
``AutoConfig``, ``AutoTokenizer``, ``AutoModelForCausalLM`` and ``AutoModel`` load a saved directory, and the
registration names the classes causalqwen defines.
"""

import json
import subprocess
import sys

import pytest
import torch

AUTO_HABIT = """
import json, sys
if sys.argv[2] == "transformers first":
    from transformers import AutoModelForCausalLM
import causalqwen
loaded = sorted(m for m in ("causalqwen.configuration", "causalqwen.modeling", "torch", "transformers")
                if m in sys.modules)
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
config = AutoConfig.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
found = [type(config).__name__, type(model).__name__, type(AutoModel.from_pretrained(path)).__name__,
         type(AutoModelForCausalLM.from_config(config)).__name__, type(AutoTokenizer.from_pretrained(path)).__name__]
tokenizer = causalqwen.NumericTokenizer.from_pretrained(path)
batch = tokenizer(["It costs 2.5 dollars."], return_tensors="pt")
print("RESULT", json.dumps([loaded, found, model(**batch).loc_Y.tolist()]))
"""


@pytest.mark.parametrize("order", ["causalqwen first", "transformers first"])
def test_import_causalqwen_lets_the_auto_classes_load_a_saved_directory(tiny, tmp_path, order):
    """The README's habit in a fresh interpreter: after ``import causalqwen`` (before or after transformers' Auto
    classes), AutoConfig, AutoModelForCausalLM and AutoModel load a saved directory without ``trust_remote_code``,
    and ``import causalqwen`` alone imported neither the model nor the configuration (nor transformers or torch).
    AutoTokenizer without consent gives transformers' own class (docs/security.md)."""

    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", AUTO_HABIT, str(tmp_path), order],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
        stdin=subprocess.DEVNULL,  # transformers asks on stdin for consent before it refuses
    )
    assert run.returncode == 0, run.stderr[-3000:]
    loaded, found, loc_Y = json.loads(run.stdout.split("RESULT ")[-1])
    assert loaded == ([] if order == "causalqwen first" else ["torch", "transformers"])
    assert found == [
        "CausalQwenConfig",
        "CausalQwenForCausalLM",
        "CausalQwenModel",
        "CausalQwenForCausalLM",
        "Qwen2Tokenizer",
    ]
    batch = tok(["It costs 2.5 dollars."], return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).loc_Y
    torch.testing.assert_close(torch.tensor(loc_Y), expected, rtol=1e-5, atol=1e-5)


def test_the_auto_registration_names_the_classes_causalqwen_defines():
    """The names `causalqwen.integrations.auto_registration` writes into transformers' tables are the model type and
    the classes of the package, and each transformers table holds them once causalqwen is imported."""
    from transformers.models.auto import configuration_auto, modeling_auto

    import causalqwen
    from causalqwen.integrations import auto_registration

    assert auto_registration.MODEL_TYPE == causalqwen.CausalQwenConfig.model_type
    assert configuration_auto.CONFIG_MAPPING_NAMES[auto_registration.MODEL_TYPE] == auto_registration.CONFIG_CLASS
    assert configuration_auto.CONFIG_MAPPING[auto_registration.MODEL_TYPE] is causalqwen.CausalQwenConfig
    for names, mapping, class_name in auto_registration.MODEL_TABLES:
        assert getattr(modeling_auto, names)[auto_registration.MODEL_TYPE] == class_name
        assert getattr(modeling_auto, mapping)[causalqwen.CausalQwenConfig] is getattr(causalqwen, class_name)
