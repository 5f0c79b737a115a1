"""The README's pipelines section runs as written, in order, in a directory of its own (see test_readme)."""

import glob
import os

import pytest
from test_readme import run_in_order, section_commands


@pytest.mark.slow
def test_the_readme_pipeline_commands_run_in_order(tmp_path):
    commands = section_commands(pipelines=True)
    assert any("tfopt.pipeline" in c for c in commands) and any(
        "tfopt.report" in c for c in commands
    ), commands
    assert commands[1].startswith(commands[0] + " --select"), commands
    stamps = {}

    def after(i, command):
        # The second command changes only the selection: every stage is kept, only the report is rebuilt.
        records = glob.glob(str(tmp_path / "runs" / "mnist_edge" / "*" / "run.json"))
        stamps[i] = {
            p: os.stat(p).st_mtime_ns for p in records if os.sep + "report" + os.sep not in p
        }

    run_in_order(commands, tmp_path, after)
    assert len(stamps[1]) >= 4 and stamps[2] == stamps[1], (stamps[1], stamps[2])
