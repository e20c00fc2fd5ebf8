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
7. ``inference``: the five inference modes; ``regression``: the law of the number that follows a prompt, and how
   answers fit their laws; ``generation``: the autoregressive loop; ``writing``: how a number is written back (the
   resolution a literal states, a value at a resolution, the spaces around numbers).
8. ``model``: the model in the design's order, embedding -> backbone -> abduction -> action -> loss, around any
   backbone; ``configuration``, ``initialization`` and ``modeling``: the config, the initial scale and threshold of a
   conversion, and the model on transformers' Qwen2 (`CausalQwenModel`, `CausalQwenForCausalLM`).
9. ``training``, ``divergence`` and ``metrics``: the training step, the bound on how far U moves, the
   evaluation metrics; ``likelihood``: the probability of a text, numbers scored as written.

The sections import only the standard library, torch, numpy, regex and each other (``configuration``,
``initialization`` and ``modeling`` build on transformers' Qwen2 as well). The infrastructure sits above them in
sub-packages: ``kernels`` (the tiled and compiled head + loss, named beside the literal one), ``checks``
(the input checks at the public doors), ``files`` (checkpoints, bases, run directories, datasets, what earlier
versions wrote), ``integrations`` (transformers' tokenizer and Auto classes, ``model.generate``, the pipeline,
the Trainer, peft's LoRA, lm-eval) and ``app`` (training runs, the command line, the demo, the embedded tiny base).

This namespace is the table of contents of what a user needs; each name is imported when it is first used
(PEP 562), so ``import causalqwen.cauchy`` costs what importing torch costs. ``import causalqwen`` registers the
classes with transformers' ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` by name
(`causalqwen.integrations.auto_registration`): the model is imported when an Auto class first asks for it.
"""

import importlib

from .files import earlier_versions
from .integrations import auto_registration

earlier_versions.install()  # import sites of earlier versions (saved directories, scripts) keep working
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
