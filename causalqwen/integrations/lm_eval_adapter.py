"""``python -m causalqwen.integrations.lm_eval_adapter``: lm-eval's command line with the ``causalqwen`` model, by the
module path the API contract names; the adapter lives in `causalqwen.app.lm_eval_adapter`."""

import sys

from ..app.lm_eval_adapter import CausalQwenLM, main

__all__ = ["CausalQwenLM", "main"]

if __name__ == "__main__":
    sys.exit(main())
