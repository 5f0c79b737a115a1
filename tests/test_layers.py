"""The layers stay one-way and the stages siblings: import-linter's contracts (setup.cfg) run with
the test suite, and no module of tfopt reaches itself through its imports."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which(
        "lint-imports"
    )
    assert exe, "import-linter is not installed: pip install -e '.[test]'"
    proc = subprocess.run(
        [exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in proc.stdout


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    import grimp

    graph = grimp.build_graph("tfopt")  # every import, lazy and TYPE_CHECKING ones included
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_a_moved_module_still_imports_from_its_old_path_with_a_warning():
    code = (
        "import warnings, tfopt.compress.common as new\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import tfopt.optimize.common as old\n"
        "    from tfopt.optimize import student\n"
        "    import tfopt.errors as errors\n"
        "assert old is new, old\n"
        "assert student.__name__ == 'tfopt.compress.student', student\n"
        "assert errors.TfoptError.__module__ == 'tfopt.core.errors', errors\n"
        "print(w[0].category.__name__, w[0].message)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DeprecationWarning tfopt.optimize.common moved to tfopt.compress.common" in proc.stdout


FILE_LINES, FUNCTION_LINES = 500, 80
#: What may stay over those limits (none today: a file or function that grows past them is split).
OVER: dict[str, int] = {}


def _sizes() -> dict[str, int]:
    """Lines of every file of tfopt over FILE_LINES and of every function over FUNCTION_LINES."""
    import ast
    import glob

    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "tfopt", "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if text.count("\n") > FILE_LINES:
            out[rel] = text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    out[f"{rel}:{node.name}"] = max(lines, out.get(f"{rel}:{node.name}", 0))
    return out


def test_no_file_or_function_grows_past_the_size_limits():
    sizes = _sizes()
    grown = {k: (OVER.get(k), v) for k, v in sizes.items() if v > OVER.get(k, 0)}
    assert not grown, f"over {FILE_LINES} lines a file or {FUNCTION_LINES} a function: {grown}"
    shrunk = {k: (v, sizes.get(k)) for k, v in OVER.items() if sizes.get(k, 0) < v}
    assert not shrunk, f"smaller now: lower (or drop) their entries in OVER: {shrunk}"


def test_the_top_level_is_the_public_api_runs_and_packages():
    top = {
        name
        for name in os.listdir(os.path.join(ROOT, "tfopt"))
        if name.endswith(".py") or not os.path.isdir(os.path.join(ROOT, "tfopt", name))
    }
    # __init__ is the public API; runs.py the run records every stage shares; _moved the old
    # paths kept for one release; __main__ and _version what Python and packaging need.
    assert top <= {"__init__.py", "__main__.py", "_version.py", "_moved.py", "runs.py"}, top


def test_the_benchmarks_import_only_the_public_api():
    import glob

    from public_api import non_public_imports

    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "*.py"))):
        with open(path, encoding="utf-8") as f:
            names = non_public_imports(f.read())
        if names:
            found[os.path.relpath(path, ROOT)] = names
    assert not found, (
        f"benchmarks import tfopt below its public API (add the name to a package's __all__): {found}"
    )


def test_no_public_name_is_shadowed_by_a_module_of_the_same_name():
    # ``from tfopt.export import evaluate`` would give the module once anything imported it.
    import importlib
    import pkgutil

    clashes = {}
    for info in pkgutil.walk_packages([os.path.join(ROOT, "tfopt")], "tfopt."):
        if not info.ispkg:
            continue
        package = importlib.import_module(info.name)
        subs = {m.name for m in pkgutil.iter_modules(package.__path__)}
        names = set(getattr(package, "__all__", ())) & subs - {"cli"}  # tfopt.config.cli: a module
        if names:
            clashes[info.name] = sorted(names)
    assert not clashes, clashes


def test_no_benchmark_file_is_over_600_lines():
    import glob

    long = {
        os.path.relpath(p, ROOT): n
        for p in glob.glob(os.path.join(ROOT, "bench", "*.py"))
        if (n := sum(1 for _ in open(p, encoding="utf-8"))) > 600
    }
    assert not long, f"split these benchmark files by job (see bench/_scaling_*.py): {long}"


BOOTSTRAP = """if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))"""


def test_every_benchmark_script_runs_on_the_harness():
    # One bootstrap, one parser (bench/_common.script_parser) and one tail (publish) for every
    # script that measures: the script holds only its protocol.
    import glob
    import re

    odd = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "[a-z]*.py"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if 'if __name__ == "__main__":' not in text:
            continue  # a module the scripts share (causes.py)
        name = os.path.basename(path)
        problems = []
        if text.count("sys.path.insert") != 1 or BOOTSTRAP not in text:
            problems.append("not the one bootstrap")
        if name != "run_all.py":  # run_all renders the docs from the results it reads
            if "script_parser(" not in text:
                problems.append("its own --out/--smoke parser")
            if "publish(" not in text or re.search(
                r"write_json_atomic\(\s*(args\.|a\.)?out\b", text
            ):
                problems.append("its own report tail")
        if problems:
            odd[name] = problems
    assert not odd, f"use bench/_common.py's script_parser and publish: {odd}"
