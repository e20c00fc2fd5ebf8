"""causalqwen: a test-first mathematical reference implementation of CausalQwen.

Modules follow the sections of the specification: ``cauchy`` (the Cauchy toolkit), ``tokenization``,
``embedding``, ``abduction``, ``action``, ``losses`` and ``modeling``.
"""

from .modeling import CausalQwenConfig, CausalQwenForCausalLM, CausalQwenOutput

__version__ = "0.1.0"

__all__ = ["CausalQwenConfig", "CausalQwenForCausalLM", "CausalQwenOutput", "__version__"]
