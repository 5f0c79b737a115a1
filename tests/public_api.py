"""What counts as tfopt's public API for the notebooks and the benchmarks that must use only it."""

from __future__ import annotations


def non_public_imports(source: str) -> list[str]:
    """The imports in ``source`` of tfopt that are not its public API: a module below a
    package's top level (``tfopt.export.runner``), or a name missing from the ``__all__`` of the
    module it is taken from (``tfopt`` or one of its packages)."""
    import ast
    import importlib

    def public(module: str) -> set[str]:
        return set(getattr(importlib.import_module(module), "__all__", ()))

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "tfopt" and len(parts) > 1 and parts[1] not in public("tfopt"):
                    if len(parts) > 2 or not hasattr(importlib.import_module(a.name), "__all__"):
                        out.append(a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tfopt":
            if node.module.count(".") > 1:
                out.append(node.module)
                continue
            names = public(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if a.name not in names]
    return out
