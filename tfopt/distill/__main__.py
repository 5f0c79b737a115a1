"""``python -m tfopt.distill``: see :mod:`tfopt.distill.cli`."""

import sys

from tfopt.distill.cli import main

if __name__ == "__main__":
    sys.exit(main())
