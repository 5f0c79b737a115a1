"""``.ci/durations.py`` tabulates a junit file per test file (the table docs/development.md holds)."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4" time="12.5">
<testcase classname="tests.test_a" name="test_one" time="2.0"><properties><property name="cpu_seconds" value="3.5" /></properties></testcase>
<testcase classname="tests.test_a" name="test_two" time="7.5"><failure message="x"/></testcase>
<testcase classname="tests.test_b.TestGroup" name="test_three" time="3.0"><properties><property name="cpu_seconds" value="1.25" /></properties></testcase>
<testcase classname="tests.test_b" name="test_four" time="0.25"><skipped message="y"/></testcase>
</testsuite></testsuites>"""


def _durations():
    spec = importlib.util.spec_from_file_location(
        "durations", os.path.join(REPO, ".ci", "durations.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_sum_each_files_tests_longest_file_first(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    durations = _durations()
    rows, totals = durations.per_file(str(junit))
    assert [(r["file"], r["tests"], r["seconds"], r["cpu"], r["longest"]) for r in rows] == [
        ("tests/test_a.py", 2, 9.5, 3.5, ("test_two", 7.5)),
        ("tests/test_b.py", 2, 3.25, 1.25, ("test_three", 3.0)),
    ]
    assert totals == {
        "tests": 4,
        "seconds": 12.75,
        "cpu": 4.75,
        "cpu_measured": True,
        "failed": 1,
        "skipped": 1,
        "wall": 12.5,
    }
    text = durations.table(rows, totals)
    assert text.splitlines()[0].startswith("4 tests (1 failed, 1 skipped)")
    assert "| `tests/test_a.py` | 2 | 10 | 4 | `test_two` (8) |" in text
    # a junit file written without the property: no CPU figure rather than a zero
    bare = durations.table(rows, {**totals, "cpu_measured": False})
    assert "| `tests/test_a.py` | 2 | 10 | - | `test_two` (8) |" in bare and "CPU min" not in bare


def test_the_development_guide_holds_a_generated_table():
    durations = _durations()
    with open(durations.DOC, encoding="utf-8") as f:
        doc = f.read()
    body = doc.split(durations.BEGIN, 1)[1].split(durations.END, 1)[0]
    assert "| file | tests | seconds | CPU seconds | longest test (s) |" in body
    assert body.count("| `tests/test_") >= 50, "run the suite, then python .ci/durations.py"
