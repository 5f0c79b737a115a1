"""tfopt.report: the report of a pipeline run (``report.md``, ``report.html``, ``report.json``, HParams).

    from tfopt.report import build
    report = build("runs/mnist_edge", select="acc_drop<=0.5,p50_us<=50")

``python -m tfopt.report RUN [--select RULE]`` does the same from the command line. Modules:
``collect`` (records -> variants), ``select`` (the rule and the choice), ``pareto``, ``targets``
(B8), ``debugger``, ``environment`` (versions, CPU, the TFLite analyzer), ``plots``, ``hparams``,
``content`` (what the report says), ``render`` (markdown, HTML) and ``builder`` (all of it,
written atomically).
"""

from tfopt.report.builder import build

__all__ = ["build"]
