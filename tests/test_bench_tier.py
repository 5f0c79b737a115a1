"""The bench tier runs when what the benchmarks exercise changed since it last passed (tests/bench_tier.py)."""

import os
import shutil

import bench_tier


def _tree(root):
    (root / "bench" / "results").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tfopt" / "export").mkdir(parents=True)
    (root / "bench" / "b1.py").write_text("from tfopt.export import runner\nimport numpy\n")
    (root / "bench" / "results" / "b1.json").write_text("{}")
    (root / "tests" / "test_bench_b1.py").write_text("def test(): pass\n")
    (root / "tests" / "test_other.py").write_text("def test(): pass\n")
    (root / "tfopt" / "__init__.py").write_text("")
    (root / "tfopt" / "export" / "__init__.py").write_text("")
    (root / "tfopt" / "export" / "runner.py").write_text("X = 1\n")
    (root / "tfopt" / "export" / "tflite.py").write_text("Y = 1\n")


def test_sources_are_the_benchmarks_their_tests_and_the_tfopt_modules_they_import(tmp_path):
    _tree(tmp_path)
    assert bench_tier.sources(str(tmp_path)) == [
        "bench/b1.py",
        "tests/test_bench_b1.py",
        "tfopt/export/__init__.py",
        "tfopt/export/runner.py",
    ]


def test_due_until_stamped_then_again_when_a_source_changes(tmp_path):
    _tree(tmp_path)
    root, quiet = str(tmp_path), {}
    assert bench_tier.due(root, quiet)[0]  # never stamped
    bench_tier.stamp(root)
    assert bench_tier.due(root, quiet) == (False, bench_tier.due(root, quiet)[1])
    assert bench_tier.due(root, {"TFOPT_BENCH_TIER": "1"}) == (True, "TFOPT_BENCH_TIER=1")
    # results, unrelated tests and unimported tfopt modules do not make it due
    (tmp_path / "bench" / "results" / "b1.json").write_text('{"new": 1}')
    (tmp_path / "tests" / "test_other.py").write_text("def test(): assert 1\n")
    (tmp_path / "tfopt" / "export" / "tflite.py").write_text("Y = 2\n")
    assert not bench_tier.due(root, quiet)[0]
    for changed in ("tfopt/export/runner.py", "bench/b1.py", "tests/test_bench_b1.py"):
        saved = tmp_path / "saved"
        shutil.copy(tmp_path / changed, saved)
        with open(tmp_path / changed, "a") as f:
            f.write("# changed\n")
        assert bench_tier.due(root, quiet)[0], changed
        shutil.copy(saved, tmp_path / changed)
        assert not bench_tier.due(root, quiet)[0], changed
    os.remove(tmp_path / "tests" / "bench_tier.json")
    assert bench_tier.due(root, quiet)[0]
