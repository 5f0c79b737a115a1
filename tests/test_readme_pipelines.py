"""The README's pipelines section runs as written, in order, in a directory of its own (see test_readme).

Its first command is the session's ``pipeline_run`` (tests/conftest.py): run once per session,
stopped and resumed there; the later commands run here, in order, on a copy of that run.
"""

import glob
import os
import shlex
import shutil

import pytest
from conftest import readme_pipeline_command
from test_readme import run_in_order, section_commands, shrink


@pytest.mark.slow
def test_the_readme_pipeline_commands_run_in_order(tmp_path, pipeline_run):
    commands = section_commands(pipelines=True)
    assert any("tfopt.pipeline" in c for c in commands) and any(
        "tfopt.report" in c for c in commands
    ), commands
    assert commands[1].startswith(commands[0] + " --select"), commands
    # The first command is the one pipeline_run ran (stopped once, then finished)
    assert readme_pipeline_command()[1:] == shlex.split(shrink(commands[0]))[1:]
    assert pipeline_run["codes"][:2] == [143, 0], pipeline_run["logs"][1][-3000:]
    shutil.copytree(pipeline_run["readme"], tmp_path / "runs" / "mnist_edge", symlinks=True)

    def stamps():
        records = glob.glob(str(tmp_path / "runs" / "mnist_edge" / "*" / "run.json"))
        return {p: os.stat(p).st_mtime_ns for p in records if os.sep + "report" + os.sep not in p}

    before = stamps()
    after_select = {}

    def after(i, command):
        if i == 1:  # the selection only: every stage is kept, only the report is rebuilt
            after_select.update(stamps())

    run_in_order(commands[1:], tmp_path, after)
    assert len(before) >= 4 and after_select == before, (before, after_select)
