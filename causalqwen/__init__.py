"""causalqwen: a test-first mathematical reference implementation of CausalQwen.

The top level follows the design, a number's path from text to loss, one module per section:

1. ``cauchy``: the Cauchy toolkit (law, CDF and tails, closure under linear maps, KL).
2. ``float32``, ``numbers`` and ``tokenization``: a value's exact float32 and its text; the number grammar; text
   to ``<NUM>`` tokens with their values.
3. ``embedding``: the numerical embedding, sign(v) ln(1 + |v|) w_num added to ``<NUM>``'s row.
4. ``abduction``: features z to the Cauchy law of the individual representation U.
5. ``action`` and ``decision``: exogenous noise and the linear map U -> (S_k, Y); the decision head that
   owns every decision and target.
6. ``losses``: One-vs-Rest classification from the Cauchy CDF and the gated Cauchy NLL of the value.
7. ``model``: the model in the design's order, embedding -> backbone -> abduction -> action -> loss, around any
   backbone; ``configuration``, ``initialization`` and ``modeling``: the config, the initial scale and threshold of a
   conversion, and the model on transformers' Qwen2 (`CausalQwenModel`, `CausalQwenForCausalLM`).
8. ``inference``: the five inference modes; ``regression``: the law of the number that follows a prompt, and how
   answers fit their laws; ``generation``: the autoregressive loop, `generate` (the key/value cache it fills is the
   model's, ``model.new_key_value_cache()``); ``writing``: how a number is written back (the resolution a literal
   states, a value at a resolution, the spaces around numbers).
9. ``training``, ``divergence`` and ``metrics``: the training step and its schedule (linear warm-up, then cosine
   decay), the bound on how far U moves, the evaluation metrics; ``likelihood``: the probability of a text, numbers
   scored as written.

Every section is torch-only: it imports the standard library, torch, numpy, regex, the other sections and the doors'
input checks (``checks``, torch-only too), and nothing of transformers, peft, accelerate, tqdm or safetensors. The
transformers adapter is three sections, named as such: ``configuration`` (a ``Qwen2Config``), ``initialization`` (the
conversion of a Qwen2 base) and ``modeling`` (a ``Qwen2PreTrainedModel``, a thin adapter around ``model``). The rest
of the transformers wing and the infrastructure sit above the sections in sub-packages: ``kernels`` (the tiled and
compiled head + loss, named beside the literal one), ``checks`` (the input checks at the public doors), ``files``
(checkpoints, bases, run directories, datasets; ``files.earlier_versions``, what earlier versions wrote, loaded when
one of their files is read), ``integrations`` (transformers' tokenizer and Auto classes, Qwen2's cache names and
masks, ``model.generate`` and its key/value cache in ``integrations.generation_mixin``, the pipeline, the Trainer,
peft's LoRA) and ``app`` (training runs, the command line, the demo, lm-eval, the embedded tiny base). ``pipelines``
is the one module path of an earlier version that saved directories import (decision D26), and ``cli`` the command
line by the path the API contract names.

This namespace is the table of contents of what a user needs; each name is imported when it is first used
(PEP 562), so ``import causalqwen.cauchy`` costs what importing torch costs. ``import causalqwen`` registers the
classes with transformers' ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` by name
(`causalqwen.integrations.auto_registration`): the model is imported when an Auto class first asks for it. It loads
nothing of earlier versions.
"""

import importlib

from .integrations import auto_registration

auto_registration.install()  # AutoConfig, AutoModel, AutoModelForCausalLM know causal_qwen, by name

__version__ = "0.1.0"

# name -> the module that defines it
_HOMES = {
    "CausalQwenConfig": "causalqwen.configuration",
    "CausalQwenForCausalLM": "causalqwen.modeling",
    "CausalQwenModel": "causalqwen.modeling",
    "CausalQwenOutput": "causalqwen.integrations.outputs",
    "DivergenceBoundTrainer": "causalqwen.integrations.bounded_trainer",
    "GenerationOutput": "causalqwen.generation",
    "generate": "causalqwen.generation",
    "NumericEncoding": "causalqwen.integrations.tokenizer",
    "NumericTokenizer": "causalqwen.integrations.tokenizer",
    "NumericTextGenerationPipeline": "causalqwen.integrations.pipelines",
    "NumericTextStreamer": "causalqwen.integrations.streamer",
    "NumberLaw": "causalqwen.regression",
    "predict_number": "causalqwen.regression",
    "PromptCompletion": "causalqwen.files.data",
    "TrainingConfig": "causalqwen.training",
    "load_abduction": "causalqwen.files.abduction_weights",
    "save_abduction": "causalqwen.files.abduction_weights",
    "train": "causalqwen.app.training_run",
}

__all__ = sorted(_HOMES) + ["__version__"]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'causalqwen' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
