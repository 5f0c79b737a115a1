"""``python -m tfopt.pipeline``: see :mod:`tfopt.pipeline.cli`."""

import sys

from tfopt.pipeline.cli import main

sys.exit(main())
