"""Old module paths that still import, for one release, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: Old dotted path -> new dotted path.
MOVED = {
    f"tfopt.optimize.{name}": f"tfopt.compress.{name}"
    for name in (
        "channel_prune",
        "channels",
        "cluster",
        "common",
        "flops",
        "latency",
        "low_rank",
        "prune",
        "quantize",
        "student",
        "surgery",
        "techniques",
    )
}
MOVED.update(
    {
        "tfopt.hosts": "tfopt.launch.hosts",
        "tfopt.kube": "tfopt.launch.kube",
        "tfopt.cli": "tfopt.config.cli",
    }
)
MOVED.update(
    {
        f"tfopt.{name}": f"tfopt.core.{name}"
        for name in (
            "_compat",
            "_keras",
            "_x86_kernels",
            "children",
            "cpu",
            "errors",
            "fileio",
            "flagcheck",
            "log",
            "native_stderr",
            "runlock",
            "specs",
            "timing",
        )
    }
)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old path to the module at its new one (the same module object)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]}; import it from there "
            "(the old path goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        """Nothing to run: the module at the new path is already imported."""


def install() -> None:
    """Puts the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
