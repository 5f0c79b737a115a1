"""The ``tfopt`` console script: ``tfopt COMMAND ...`` = ``python -m tfopt.COMMAND ...``."""

from __future__ import annotations

import difflib
import importlib
import sys

# command -> (module with main(argv), one-line purpose); no TensorFlow import until a command runs.
COMMANDS = {
    "train": ("tfopt.train.cli", "train a model under any tf.distribute strategy"),
    "distill": ("tfopt.distill.cli", "distil trained teachers into a (compressed) student"),
    "optimize": (
        "tfopt.optimize.cli",
        "prune, quantization-aware train or cluster a trained run (tfmot)",
    ),
    "export": ("tfopt.export.cli", "convert a run to TFLite, evaluate and benchmark every mode"),
    "federated": (
        "tfopt.federated.cli",
        "train over Flower clients that keep their data (FedAvg, FedProx)",
    ),
    "pipeline": (
        "tfopt.pipeline.cli",
        "run a pipeline end to end: teacher, student, compression, export, report",
    ),
    "report": ("tfopt.report.cli", "(re)build the report of a finished pipeline run"),
    "launch": ("tfopt.launch", "run a command as every task of a local TF_CONFIG cluster"),
    "data.to_folder": ("tfopt.data.to_folder", "write a dataset as class folders of PNG images"),
    "cpu": ("tfopt.core.cpu", "measure this CPU's fp32 and int8 multiply-add peaks (the roofline)"),
}


def usage() -> str:
    """``tfopt --help``: every command with its purpose."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {purpose}" for name, (_, purpose) in COMMANDS.items()]
    return (
        "usage: tfopt COMMAND [ARGS...]   (tfopt --version)\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\nsee `tfopt COMMAND --help`"
    )


def main(argv: list[str] | None = None) -> int:
    """Dispatches ``tfopt COMMAND [ARGS...]`` to ``python -m tfopt.COMMAND``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from tfopt._version import __version__

        print(f"tfopt {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(
            f"tfopt: error: unknown command {argv[0]!r}; {hint}choose one of {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
