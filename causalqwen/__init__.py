"""causalqwen: a test-first mathematical reference implementation of CausalQwen.

Modules follow the sections of the specification: ``cauchy`` (the Cauchy toolkit), ``tokenization``,
``embedding``, ``abduction``, ``action``, ``losses``, ``modeling``, ``inference`` (the five modes)
and ``generation``.
"""

from .generation import GenerationOutput, generate
from .modeling import CausalQwenConfig, CausalQwenForCausalLM, CausalQwenOutput
from .tokenization import NumericTokenizer

__version__ = "0.1.0"

__all__ = [
    "CausalQwenConfig",
    "CausalQwenForCausalLM",
    "CausalQwenOutput",
    "GenerationOutput",
    "NumericTokenizer",
    "generate",
    "__version__",
]
