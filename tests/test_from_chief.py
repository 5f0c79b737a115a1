"""``tfopt.runtime.strategy.from_chief`` on two real multi_worker_mirrored processes: what the chief
alone computes (channel pruning's latency table), every worker gets."""

import os
import subprocess
import sys

import pytest
from isolation import ISOLATED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_chief_alone_computes_and_every_worker_gets_its_values():
    """Values only the chief can give (its index + 1), computed once, on both workers. No clock.

    Under MWMS channel pruning plans from the chief's latency table (workers that timed their own
    would plan other widths). The optimize matrix's MWMS cell used to show it through identical
    digests after a latency target near the measured p50, which raced the chief's own timing;
    its target is now far above any time, so its plan no longer depends on whose times the
    workers got. Breaks when a worker computes its own values (its index + 1 is 2) or gets none."""
    helper = os.path.join(ROOT, "tests", "chief_values.py")
    cmd = [*ISOLATED, sys.executable, "-m", "tfopt.launch", "--workers", "2", "--timeout", "120"]
    proc = subprocess.run(
        [*cmd, "--", sys.executable, helper],
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "[worker:0] FROM_CHIEF worker:0 values=1,7 computed=1" in proc.stdout, proc.stdout
    assert "[worker:1] FROM_CHIEF worker:1 values=1,7 computed=0" in proc.stdout, proc.stdout
