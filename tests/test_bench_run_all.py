"""bench/run_all.py: docs/benchmarks.md and the README's summary come from the committed result files."""

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import run_all  # noqa: E402
from bench._common import figure  # noqa: E402


def test_figure_takes_the_median_and_judges_it():
    f = figure(
        "epoch 1, tfopt / naive", [1.7, 1.95, 1.82, None, float("nan")], "x", target=(">=", 1.8)
    )
    assert f["value"] == pytest.approx(1.82) and f["spread"] == [1.7, 1.95] and f["repeats"] == 3
    assert (f["target"], f["status"]) == (">= 1.8x", "pass")
    assert figure("loss", [0.4, 0.5, 0.6], "pt", target=("<=", 0.3))["status"] == "MISS"
    assert figure("loss", [], "pt", target=("<=", 0.3))["status"] == "n/a"
    assert figure("info", [3.0], "ms")["status"] == "-"
    with pytest.raises(ValueError, match="target op '=>'"):
        figure("bad", [1.0], "x", target=("=>", 1.0))


def test_every_committed_result_renders_and_its_verdicts_follow_from_its_numbers():
    seen = 0
    for bench in run_all.BENCHES:
        if not os.path.exists(bench.result):
            continue
        with open(bench.result, encoding="utf-8") as fh:
            res = json.load(fh)
        assert res["id"] == bench.id and res["figures"], bench.result
        assert res["lscpu"]["flags"], bench.result  # the CPU's flags travel with every figure
        for f in res["figures"]:
            again = figure(
                f["name"], f["values"], f["unit"], target=(f["op"], f["bound"]) if f["op"] else None
            )
            assert again["value"] == f["value"], (bench.id, f["name"])
            if f["status"].startswith("n/a:") or f["status"].startswith("n/a without"):
                continue  # the benchmark declined to judge and says why (e.g. no AMX on this CPU)
            assert again["status"] == f["status"], (bench.id, f["name"])
        block = run_all.section(bench)
        assert block.startswith(f"## {bench.id}: {bench.title}") and bench.command in block
        assert block.count("\n| ") == len(res["figures"]) + 1  # header + one row per figure
        misses = [f["name"] for f in res["figures"] if f["status"] == "MISS"]
        # Every committed miss has its cause: a line in bench/causes.py, printed under the table.
        assert [m for m in misses if run_all.cause(bench.id, m) is None] == [], bench.id
        causes = {run_all.cause(bench.id, m) for m in misses}  # one line per cause
        assert block.count("\n- ") == len(causes) and run_all.UNKNOWN not in block, bench.id
        assert all(m in block.split("Why the misses:")[-1] for m in misses), bench.id
        seen += 1
    assert seen >= 1


def test_the_page_and_the_readme_summary_are_what_the_results_give():
    with open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8") as fh:
        assert fh.read() == run_all.page(), "run: PYTHONPATH=. python bench/run_all.py --table-only"
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    start, end = text.index(run_all.START) + len(run_all.START), text.index(run_all.END)
    assert text[start:end].strip() == run_all.summary().strip(), (
        "run: PYTHONPATH=. python bench/run_all.py --table-only"
    )


def test_a_miss_without_a_recorded_cause_says_so(tmp_path, monkeypatch):
    bench = run_all.Bench("B99", "nothing.py", "a made-up benchmark")
    res = {
        "figures": [
            figure("speed", [1.0], "x", target=(">=", 2.0)),
            figure("size", [3.0], "x", target=(">=", 2.0)),
        ]
    }
    monkeypatch.setattr(run_all.Bench, "result", property(lambda self: str(tmp_path / "r.json")))
    (tmp_path / "r.json").write_text(json.dumps(res))
    block = run_all.section(bench)
    assert block.endswith(f"Why the misses:\n\n- speed: {run_all.UNKNOWN}"), block
    assert "| B99 a made-up benchmark" not in run_all.summary([bench])
    assert "| 1 of 2 |" in run_all.summary([bench])


def test_update_readme_rewrites_only_between_the_markers(tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"# x\nbefore\n{run_all.START}\nold\n{run_all.END}\nafter\n")
    assert run_all.update_readme(str(path), "new table") is True
    assert path.read_text() == f"# x\nbefore\n{run_all.START}\nnew table\n{run_all.END}\nafter\n"
    assert run_all.update_readme(str(path), "new table") is False
    path.write_text("no markers\n")
    with pytest.raises(SystemExit, match="lacks the"):
        run_all.update_readme(str(path), "t")
    assert path.read_text() == "no markers\n"


def test_only_names_known_benchmarks():
    assert [b.id for b in run_all.select("b2, B7")] == ["B2", "B7"]
    with pytest.raises(SystemExit, match="unknown benchmark 'B19'; choose from B1, B2"):
        run_all.select("B2,B19")
