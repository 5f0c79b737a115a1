"""``python -m tfopt.launch``: see :mod:`tfopt.launch`."""

import sys

from tfopt.launch.cli import main

sys.exit(main())
