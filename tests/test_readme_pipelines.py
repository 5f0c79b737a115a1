"""The README's pipelines section runs as written, in order, in a directory of its own (see test_readme)."""
import pytest
from test_readme import run_in_order, section_commands


@pytest.mark.slow
def test_the_readme_pipeline_commands_run_in_order(tmp_path):
    commands = section_commands(pipelines=True)
    assert any("tfopt.pipeline" in c for c in commands) and any("tfopt.report" in c for c in commands), commands
    run_in_order(commands, tmp_path)
