"""``python -m tfopt.federated``: see :mod:`tfopt.federated.cli`."""

import sys

from tfopt.federated.cli import main

if __name__ == "__main__":
    sys.exit(main())
