"""Packages whose names load on first use (PEP 562), so that importing one stays cheap: a
command line checks its flags, and a parameter-server task serves, before TensorFlow or tfmot
load."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def exports(package: str, homes: Mapping[str, str]) -> tuple[list[str], Callable[[str], object]]:
    """``(__all__, __getattr__)`` for ``package``, whose names live in other modules.

    Args:
        package: The package's ``__name__``.
        homes: Each public name -> the module it lives in, or ``module:attribute`` when it is
            published under another name.

    Returns:
        The sorted names, and the module-level ``__getattr__`` that imports a name's home on first use.
    """

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = homes[name].partition(":")
        return getattr(importlib.import_module(module), attribute or name)

    return sorted(homes), __getattr__
