"""Validation experiments V1–V8: every quantitative claim of the spec, with numbers and figures.

Run ``python -m validation [--quick] [--out DIR]``; see `validation.__main__`. One module per
experiment (``v1_closure`` ... ``v8_learning``), each with ``run(quick, out_dir) -> ExperimentResult``;
`validation.common` writes the report.
"""
