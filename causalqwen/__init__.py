"""causalqwen: a test-first mathematical reference implementation of CausalQwen."""

__version__ = "0.1.0"
