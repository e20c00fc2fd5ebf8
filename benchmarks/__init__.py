"""Benchmarks: speed and memory goals, measured side by side in one run (never timed unit tests).

Run from the repository root: ``python -m benchmarks --help``.
"""
