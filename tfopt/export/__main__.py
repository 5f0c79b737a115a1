"""``python -m tfopt.export``: see ``tfopt.export.cli``."""

import sys

from tfopt.export.cli import main

sys.exit(main())
