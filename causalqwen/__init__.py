"""causalqwen: a test-first mathematical reference implementation of CausalQwen.

The top level follows the design, a number's path from text to loss, one module per section:

1. ``cauchy``: the Cauchy toolkit (law, CDF and tails, closure under linear maps, KL).
2. ``numbers`` and ``tokenization``: the number grammar; text to ``<NUM>`` tokens with their values.
3. ``embedding``: the numerical embedding, sign(v) ln(1 + |v|) w_num added to ``<NUM>``'s row.
4. ``abduction``: features z to the Cauchy law of the individual representation U.
5. ``action`` and ``decision``: exogenous noise and the linear map U -> (S_k, Y); the decision head that
   owns every decision and target.
6. ``losses``: One-vs-Rest classification from the Cauchy CDF and the gated Cauchy NLL of the value.
7. ``inference``: the five inference modes; ``generation``: the autoregressive loop; ``writing``: how a number
   is written back (the resolution a literal states, a value at a resolution, the spaces around numbers).
8. ``configuration``, ``initialization`` and ``modeling``: the config, the initial scale and threshold of a
   conversion (decision D14), and the model (`CausalQwenModel`, `CausalQwenForCausalLM`).
9. ``training``, ``divergence`` and ``metrics``: the training loop, the bound on how far U moves, the
   evaluation metrics; ``likelihood``: the probability of a text, numbers scored as written (decision D16).

Infrastructure lives in sub-packages: ``kernels`` (the tiled and compiled head + loss), ``files`` (checkpoints,
bases, run directories, datasets), ``integrations`` (transformers' Auto classes, ``model.generate``, the
pipeline, peft's LoRA, lm-eval), ``checks`` (the input checks at the public door) and ``app`` (command line, demo, the
embedded tiny base).
"""

from .integrations import old_paths

old_paths.install()  # old module paths (before the sub-packages) import as aliases that warn

from .configuration import CausalQwenConfig  # noqa: E402
from .generation import GenerationOutput, generate  # noqa: E402
from .integrations.pipelines import NumericTextGenerationPipeline  # noqa: E402
from .integrations.streamer import NumericTextStreamer  # noqa: E402
from .modeling import CausalQwenForCausalLM, CausalQwenModel, CausalQwenOutput  # noqa: E402
from .tokenization import NumericEncoding, NumericTokenizer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CausalQwenConfig",
    "CausalQwenForCausalLM",
    "CausalQwenModel",
    "CausalQwenOutput",
    "GenerationOutput",
    "NumericEncoding",
    "NumericTextGenerationPipeline",
    "NumericTextStreamer",
    "NumericTokenizer",
    "generate",
    "__version__",
]
