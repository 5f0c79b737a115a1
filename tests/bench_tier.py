"""When the bench tier runs: the benchmarks' ``--smoke`` tests (marked ``bench``) run when what they
exercise changed since they last passed, or when ``TFOPT_BENCH_TIER=1`` asks for them.

What they exercise: every file under ``bench/``, their tests (``tests/test_bench_*.py``,
``tests/bench_checks.py``) and the tfopt modules the benchmark scripts import directly. Their
digest is stamped in ``tests/bench_tier.json`` by ``.ci/bench-tier`` after the tier passed; a
commit that changes any of them without running the tier again runs it in CI. On every commit the
checks of each benchmark's JSON run on its committed result file instead (the unmarked tests of
``tests/test_bench_*.py``).

    python tests/bench_tier.py            # says whether the tier is due, and why
    python tests/bench_tier.py --stamp    # records the digest (after the tier passed)
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAMP = os.path.join("tests", "bench_tier.json")
ENV = "TFOPT_BENCH_TIER"


def _imported_tfopt_files(path: str, root: str) -> set[str]:
    """The tfopt source files a Python file imports directly (modules, or the package's __init__)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    out = set()
    for name in names:
        if name != "tfopt" and not name.startswith("tfopt."):
            continue
        base = os.path.join(root, *name.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                out.add(os.path.relpath(candidate, root))
    return out


def sources(root: str = REPO) -> list[str]:
    """The files the bench tier exercises, relative to ``root``, sorted."""
    bench = [
        os.path.relpath(p, root)
        for p in glob.glob(os.path.join(root, "bench", "**", "*"), recursive=True)
        if os.path.isfile(p)
        and "/results/" not in p.replace(os.sep, "/")
        and "__pycache__" not in p
    ]
    tests = [
        os.path.relpath(p, root)
        for pattern in ("test_bench_*.py", "bench_checks.py")
        for p in glob.glob(os.path.join(root, "tests", pattern))
    ]
    tfopt = set()
    for rel in bench:
        if rel.endswith(".py"):
            tfopt |= _imported_tfopt_files(os.path.join(root, rel), root)
    return sorted(set(bench) | set(tests) | tfopt)


def digest(root: str = REPO) -> str:
    """sha256 over the names and contents of :func:`sources`."""
    h = hashlib.sha256()
    for rel in sources(root):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.replace(os.sep, "/").encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def due(root: str = REPO, environ: dict | None = None) -> tuple[bool, str]:
    """``(whether the bench tier runs, why)``."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV) == "1":
        return True, f"{ENV}=1"
    try:
        with open(os.path.join(root, STAMP), encoding="utf-8") as f:
            stamped = json.load(f).get("digest")
    except (OSError, ValueError):
        stamped = None
    if stamped != digest(root):
        return True, f"the benchmarks or what they import changed since {STAMP} was stamped"
    return False, (
        f"the bench tier passed on these benchmarks and what they import ({STAMP}); "
        f"{ENV}=1 runs it, and the committed results are checked instead"
    )


def stamp(root: str = REPO) -> str:
    """Writes the digest to ``tests/bench_tier.json`` (atomically); returns it."""
    value = digest(root)
    path = os.path.join(root, STAMP)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"digest": value, "files": len(sources(root))}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return value


if __name__ == "__main__":
    if sys.argv[1:] == ["--stamp"]:
        print(f"bench tier stamped: {stamp()}")
    else:
        answer, why = due()
        print(f"due: {answer} ({why})")
