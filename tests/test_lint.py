"""The code stays formatted and lint-free: ruff (configured in pyproject.toml) runs with the test suite."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert exe, "ruff is not installed: pip install -e '.[test]'"
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_finds_nothing():
    proc = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_ruff_format_leaves_every_file_as_it_is():
    proc = _ruff("format", "--no-cache", "--check", ".")
    assert proc.returncode == 0, f"run: ruff format .\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"


_TF_FAMILY = ("tensorflow", "tf_keras", "tensorflow_model_optimization", "tensorflow_datasets")


def _imports_tensorflow_before_keras_flags(path: str) -> str | None:
    """The first top-level TensorFlow-family import of the file, if no tfopt.core._keras import precedes it."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name == "tfopt.core._keras":
                return None
            if name.split(".")[0] in _TF_FAMILY:
                return f"{os.path.relpath(path, ROOT)}:{node.lineno}: import {name}"
    return None


def test_tfopt_keras_comes_before_every_top_level_tensorflow_import():
    # TF_USE_LEGACY_KERAS and the native log level are read when TensorFlow is first imported.
    import glob

    own = {os.path.join(ROOT, "tfopt", "core", "_keras.py")}
    files = [
        p
        for d in ("tfopt", "tests", "bench", "pipelines")
        for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
        if p not in own
    ]
    early = [hit for hit in map(_imports_tensorflow_before_keras_flags, files) if hit]
    assert early == [], (
        "import tfopt.core._keras first (from tfopt.core._keras import tf):\n" + "\n".join(early)
    )


def test_the_import_order_check_finds_an_early_tensorflow_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\nimport tensorflow_model_optimization as tfmot\nfrom tfopt.core._keras import tf\n"
    )
    good = tmp_path / "good.py"
    good.write_text(
        "import os\nfrom tfopt.core._keras import tf\nimport tensorflow_model_optimization\n"
    )
    assert _imports_tensorflow_before_keras_flags(str(bad)).endswith(
        "import tensorflow_model_optimization"
    )
    assert _imports_tensorflow_before_keras_flags(str(good)) is None


# Modules that are programs: they print their results (a child's JSON protocol on stdout included).
_PROGRAMS = (
    "cli.py",
    "__main__.py",
    "launch/supervise.py",  # the launcher prints its own lines beside its tasks
    "keras_latency.py",
    "to_folder.py",
    "/cpu.py",
    "data/serve.py",
)


def _prints(path: str) -> list[int]:
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]


def test_the_library_logs_and_only_programs_print():
    # A line for the user goes through logging (tfopt.core.log): the command lines decide where it goes.
    import glob

    found = [
        f"{os.path.relpath(path, ROOT)}:{line}"
        for path in glob.glob(os.path.join(ROOT, "tfopt", "**", "*.py"), recursive=True)
        if not path.endswith(_PROGRAMS)
        for line in _prints(path)
    ]
    assert found == [], "log it (logging.getLogger(__name__)) instead:\n" + "\n".join(found)


def test_the_print_check_finds_a_print(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import sys\n\ndef f():\n    print('x', file=sys.stderr)\n")
    assert _prints(str(module)) == [4]
