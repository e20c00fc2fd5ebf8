"""Command line, the demo and the embedded tiny base."""
