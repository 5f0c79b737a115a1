"""``python -m tfopt.train``: see :mod:`tfopt.train.cli`."""

import sys

from tfopt.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
