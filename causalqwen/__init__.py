"""causalqwen: a test-first mathematical reference implementation of CausalQwen.

One small module per concept: ``cauchy`` (the Cauchy toolkit and the OvR tail kernel), ``numbers`` (the
number grammar), ``tokenization``, ``embedding``, ``abduction``, ``action``, ``head`` (the decision head),
``losses`` (literal) and ``fused`` (the tiled head + loss), ``modeling`` (`CausalQwenModel`,
`CausalQwenForCausalLM`), ``initialization`` (the initial scale and threshold of a conversion, decision D14), ``inference`` (the five modes), ``generation`` and ``hf_generation``
(``model.generate``), ``pipelines`` (``"text-generation"``) and ``auto`` (what a saved directory names for
transformers' Auto classes); ``doors`` and ``checks`` hold the input checks, ``loading`` and ``checkpoint``
what is read from disk.
"""

from .generation import GenerationOutput, generate
from .modeling import CausalQwenConfig, CausalQwenForCausalLM, CausalQwenModel, CausalQwenOutput
from .pipelines import NumericTextGenerationPipeline
from .tokenization import NumericEncoding, NumericTokenizer

__version__ = "0.1.0"

__all__ = [
    "CausalQwenConfig",
    "CausalQwenForCausalLM",
    "CausalQwenModel",
    "CausalQwenOutput",
    "GenerationOutput",
    "NumericEncoding",
    "NumericTextGenerationPipeline",
    "NumericTokenizer",
    "generate",
    "__version__",
]
