"""``python -m tfopt.optimize``: see :mod:`tfopt.optimize.cli`."""

import sys

from tfopt.optimize.cli import main

if __name__ == "__main__":
    sys.exit(main())
