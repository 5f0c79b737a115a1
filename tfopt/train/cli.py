"""``python -m tfopt.train``: argument parsing only; the work is :func:`tfopt.train.stage.run`."""

from __future__ import annotations

import json

from tfopt.config import cli
from tfopt.core import flagcheck

PROG = "tfopt train"
DESCRIPTION = "Train a model under any tf.distribute strategy and write a run directory."


def build_parser() -> cli.ArgumentParser:
    """The argument parser of ``tfopt train``."""
    parser = cli.ArgumentParser(prog=PROG, description=DESCRIPTION)
    cli.add_config_args(parser, (*cli.TRAINING, "privacy"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.train``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = flagcheck.explicit(parser, argv)

    def body() -> int:
        cfg = cli.config_from_args(args)
        cli.check_config_flags(cfg, given)
        if args.print_config:
            print(json.dumps(cfg.to_dict(), indent=2))
            return 0
        from tfopt.train.stage import run

        run(cfg, overwrite=args.overwrite)
        return 0

    return cli.run_main(PROG, body, cli.verbosity(args))
