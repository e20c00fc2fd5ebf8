"""Shared by every test, the Markdown examples of README.md and docs/ included (pytest-codeblocks).

The shell examples call ``causalqwen`` and ``python`` as a reader would after the README's set-up; a test run
started as ``.venv/bin/python -m pytest`` has not activated the environment, so its scripts directory goes
first on PATH for the processes the examples start.
"""

import os
import sys


def pytest_configure(config):
    scripts = os.path.dirname(sys.executable)
    os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
