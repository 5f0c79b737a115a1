"""The ``tfopt`` console script: ``tfopt COMMAND ...`` = ``python -m tfopt.COMMAND ...``."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {"train": "tfopt.train", "launch": "tfopt.launch", "export": "tfopt.export.cli", "distill": "tfopt.distill",
            "optimize": "tfopt.optimize.cli"}


def main(argv: list[str] | None = None) -> int:
    """Dispatches ``tfopt COMMAND [ARGS...]`` to ``python -m tfopt.COMMAND``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: tfopt {{{','.join(COMMANDS)}}} [ARGS...]\n  see `tfopt COMMAND --help`")
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"tfopt: error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
