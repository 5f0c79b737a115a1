"""S1, the soak: a real training run with backups and validation; nothing it holds may grow."""

import json
import os
import subprocess
import sys

import pytest
from bench_checks import check_figures, committed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_slope_and_summary_against_hand_computed_values():
    sys.path.insert(0, ROOT)
    from bench.soak import slope, summarize

    assert slope([1, 3, 5, 7]) == pytest.approx(2.0) and slope([4]) == 0.0
    rows = [
        {"rss_kib": 900, "open_files": 12, "threads": 30, "backup_bytes": 10},  # warm-up, ignored
        *(
            {
                "rss_kib": 100 + 10 * i,
                "open_files": 9 + (i == 3),
                "threads": 27,
                "backup_bytes": 100 + 50 * (i > 2),
            }
            for i in range(6)
        ),
    ]
    stats = summarize(rows)
    assert stats == {
        "rss_kib_per_epoch": 10.0,
        "open_files_growth": 1,
        "threads_growth": 0,
        "backup_bytes_max": 150,
        "backup_growth_ratio": 1.5,
    }


@pytest.mark.slow
@pytest.mark.bench
def test_a_short_soak_holds_memory_files_threads_and_disk(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            sys.executable,
            "bench/soak.py",
            "--epochs",
            "30",
            "--steps-per-epoch",
            "40",
            "--backup-every",
            "15",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=600,
    )
    res = json.loads(out.read_text())
    assert [f["status"] for f in res["figures"]] == ["pass"] * 4, (
        res["figures"],
        proc.stdout[-3000:],
    )
    assert proc.returncode == 0 and res["parameters"]["steps"] == 1200 and len(res["epochs"]) == 30
    check_result(res)


def check_result(res: dict) -> None:
    """Everything an S1 result must get right whatever its figures (a short soak's or a full one's)."""
    sys.path.insert(0, ROOT)
    from bench.soak import summarize

    par = res["parameters"]
    assert res["id"] == "S1" and res["lscpu"]["flags"]
    assert (
        par["steps"] == par["epochs"] * par["steps_per_epoch"]
        and len(res["epochs"]) == par["epochs"]
    )
    assert [r["epoch"] for r in res["epochs"]] == list(range(1, par["epochs"] + 1))
    assert res["statistics"]["backup_bytes_max"] > 0  # backups were written (and rotated)
    # the statistics are the epochs' samples', each figure its statistic, each verdict its number's
    stats = summarize(res["epochs"])
    assert res["statistics"] == stats
    assert [f["values"] for f in res["figures"]] == [
        [stats[key]]
        for key in (
            "rss_kib_per_epoch",
            "open_files_growth",
            "threads_growth",
            "backup_growth_ratio",
        )
    ]
    check_figures(res)


def test_the_committed_soak_result_holds_together():
    check_result(committed("soak"))
