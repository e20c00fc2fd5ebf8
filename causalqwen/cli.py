"""``python -m causalqwen.cli``: the command line by the module path the API contract names, `causalqwen.app.cli`
(the ``causalqwen`` console script runs the same ``main``). Nothing else imports it."""

import sys

from .app.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
