"""Written by causalqwen's save_pretrained: the classes that config.json and tokenizer_config.json name,
from the installed causalqwen package.

causalqwen is not on the Python package index, so transformers' advice `pip install causalqwen` cannot
work: install it from a clone of its repository (`pip install -e .` in the clone), or from a wheel built
there with `python -m build --wheel` (`pip install dist/causalqwen-*.whl`).
"""
from causalqwen.configuration import CausalQwenConfig  # noqa: F401
from causalqwen.modeling import CausalQwenForCausalLM, CausalQwenModel  # noqa: F401
from causalqwen.integrations.pipelines import NumericTextGenerationPipeline  # noqa: F401
from causalqwen.tokenization import NumericTokenizer  # noqa: F401
