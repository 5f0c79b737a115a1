"""tfopt.core: the ground floor every layer may import (it imports none of them).

Names load on first use (PEP 562): the errors, atomic file writing, the host's CPU and its peaks,
markdown tables and logging set-up.
"""

from tfopt.core.lazy import exports

_EXPORTS = {
    "ConfigError": "tfopt.core.errors",
    "TargetOutOfReach": "tfopt.core.errors",
    "TfoptError": "tfopt.core.errors",
    "cpu_info": "tfopt.core.cpu",
    "peak_summary": "tfopt.core.cpu",
    "peaks": "tfopt.core.cpu",
    "write_json": "tfopt.core.fileio",
    "write_text": "tfopt.core.fileio",
    "markdown_table": "tfopt.core.tables",
    "QUIET": "tfopt.core.log",
    "configure_logging": "tfopt.core.log:configure",
}

__all__, __getattr__ = exports(__name__, _EXPORTS)
