"""Validation experiments V1–V8: every quantitative claim of the spec, with numbers and figures.

Run ``python -m validation [--quick] [--out DIR]``; see `validation.__main__`. One module per
experiment (``v1_closure`` ... ``v8_learning``), each with ``run(quick, out_dir) -> ExperimentResult``;
`validation.common` writes the report.

The report's Robustness section is `validation.robustness` (`run_suite`), which gathers the tables of
``bad_inputs``, ``tampered_checkpoints``, ``extreme_inputs``, ``trust`` (one table per boundary: configuration,
files and checkpoints, run directories, model inputs, generation, tokenizer and text, adapters, command line)
and ``real_text``;
``cases`` says how a row is judged, and ``fixtures`` holds what the experiments and the rows start from.
"""
