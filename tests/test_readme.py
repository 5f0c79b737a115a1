"""README.md can be followed as written: every command of its ``bash`` blocks runs, in order.

The first block (the two set-up commands that create ``.venv``) is what ``.ci/run`` itself runs.
Every later command runs in a fresh directory, in the order shown, so each example finds the
run directories an earlier one made. The pipelines section makes and reads only its own run
directories, so it runs in a directory of its own (``test_readme_pipelines.py``, beside this
test under pytest-xdist); every other section runs here, in one directory. Work is kept small by adding flags right after the
command's name (the command's own flags come later and win): ``--limit`` for the training-like
stages (``TFOPT_README_LIMIT`` records per split, default 512), the smoke variant for the pipelines
(under their default strategy) and fewer evaluation examples and timing runs for the export.
"""
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from isolation import ISOLATED

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = os.environ.get("TFOPT_README_LIMIT", "512")
SMALL = {
    "tfopt.train": ["--limit", LIMIT, "--quiet"],
    "tfopt.distill": ["--limit", LIMIT, "--quiet"],
    "tfopt.optimize": ["--limit", LIMIT, "--quiet"],
    # The pipelines' default strategy (the smoke variant's own is one_device): so the README's
    # second pipeline command, which names it, finds every stage finished, as it says.
    "tfopt.pipeline": ["--variant", "smoke", "--strategy", "mirrored", "--quiet"],
    # The slice's models train a dozen steps (near chance): int8 flips many of their near-tied
    # top-1 answers, so the fidelity gate (tested on trained models in test_export) is loosened.
    "tfopt.export": ["--eval-limit", "300", "--runs", "10", "--warmup", "2", "--calibration-steps", "2",
                     "--search-limit", "300", "--min-agreement", "0.9", "--max-accuracy-drop", "10",
                     "--no-keras-latency", "--quiet"],
}


PIPELINES = "From data to an edge model"  # the heading of the section that runs on its own


def readme_commands(text: str) -> list[str]:
    """The commands of every ``bash`` block after the first, comments removed, continuations joined."""
    return [c for _title, commands in readme_sections(text) for c in commands]


def readme_sections(text: str) -> list[tuple[str, list[str]]]:
    """``[(level-2 heading, its commands), ...]`` in order, for the sections after the set-up block."""
    out = []
    for i, part in enumerate(re.split(r"^## ", text, flags=re.M)):
        title = part.splitlines()[0] if i else ""
        commands = []
        for block in re.findall(r"```bash\n(.*?)```", part, re.S)[(0 if i else 1):]:
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    commands.append(line)
        if commands:
            out.append((title, commands))
    return out


def section_commands(pipelines: bool) -> list[str]:
    """The README's commands of the pipelines section (True) or of every other section (False)."""
    sections = readme_sections(open(os.path.join(REPO, "README.md"), encoding="utf-8").read())
    assert any(t.startswith(PIPELINES) for t, _ in sections), [t for t, _ in sections]
    return [c for title, commands in sections if title.startswith(PIPELINES) == pipelines for c in commands]


def shrink(command: str) -> str:
    """``command`` with the small-slice flags added after every ``python -m tfopt.X``."""
    words = shlex.split(command)
    out = []
    for i, word in enumerate(words):
        out.append(word)
        if i >= 1 and words[i - 1] == "-m" and word in SMALL:
            if word == "tfopt.export" and "--from" not in words[i + 1:]:
                continue  # --evaluate / --benchmark take their own flags
            if word == "tfopt.optimize" and "--inspect" in words[i + 1:]:
                continue
            out.extend(SMALL[word])
    return shlex.join(out)


def test_readme_commands_are_extracted():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    commands = readme_commands(text)
    assert len(commands) >= 15 and all("tfopt" in c for c in commands), commands
    # Every command line of every bash block but the set-up one is in exactly one of the two tests.
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)[1:]
             for ln in b.replace("\\\n", " ").splitlines()]
    assert sorted(section_commands(True) + section_commands(False)) == sorted(
        ln for ln in lines if ln and not ln.startswith("#"))
    assert shrink("python -m tfopt.launch --workers 2 -- python -m tfopt.train -o r").endswith(
        f"python -m tfopt.train --limit {LIMIT} --quiet -o r")


def run_in_order(commands: list[str], tmp_path, after=None) -> None:
    """Runs ``commands`` (shrunk to the small slice) one after another in ``tmp_path``; fails on the first error.

    ``after(i, command)``, if given, is called after command ``i`` (1-based) succeeded.
    """
    os.symlink(os.path.join(REPO, "pipelines"), tmp_path / "pipelines")
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""), PYTHONUNBUFFERED="1")
    for i, command in enumerate(commands, 1):
        small = shrink(command)
        # Commands that start TensorFlow servers run in a private network namespace where possible.
        prefix = ISOLATED if "tfopt.launch" in small else []
        started = time.monotonic()
        proc = subprocess.run([*prefix, "bash", "-c", small], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        print(f"[{i}/{len(commands)}] exit {proc.returncode} in {time.monotonic() - started:.0f} s: {command}",
              flush=True)
        assert proc.returncode == 0, (f"README command {i} failed: {command}\nran: {small}\n"
                                      + proc.stdout[-3000:] + proc.stderr[-3000:])
        if after is not None:
            after(i, command)


@pytest.mark.slow
def test_every_readme_command_runs_in_order(tmp_path):
    run_in_order(section_commands(pipelines=False), tmp_path)
