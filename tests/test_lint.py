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
