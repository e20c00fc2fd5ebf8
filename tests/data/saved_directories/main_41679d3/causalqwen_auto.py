"""Written by causalqwen's save_pretrained: the classes that config.json and tokenizer_config.json name, from the installed causalqwen package (pip install causalqwen)."""
from causalqwen.modeling import CausalQwenConfig, CausalQwenForCausalLM, CausalQwenModel  # noqa: F401
from causalqwen.pipelines import NumericTextGenerationPipeline  # noqa: F401
from causalqwen.tokenization import NumericTokenizer  # noqa: F401
