"""``python -m tfopt.report``: see :mod:`tfopt.report.cli`."""

import sys

from tfopt.report.cli import main

sys.exit(main())
