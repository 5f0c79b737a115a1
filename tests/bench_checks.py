"""What a benchmark's JSON must get right whatever its figures: each verdict follows from its number."""

import operator

OPS = {">=": operator.ge, "<=": operator.le}


def bar(target: dict) -> tuple[str, float]:
    """The (op, bound) of a target entry, in any of the benchmarks' spellings."""
    if "op" in target:
        return target["op"], float(target["value"] if "value" in target else target["target"])
    op, value = target["target"].split()
    return op, float(value)


def check_verdicts(targets: dict) -> None:
    """Every ``pass`` is the comparison of ``measured`` with the bar (None when nothing was measured)."""
    assert targets, "no targets"
    for key, target in targets.items():
        op, bound = bar(target)
        measured = target["measured"]
        if measured is None or measured != measured:
            assert target["pass"] is None, key
        else:
            assert target["pass"] is OPS[op](measured, bound), (key, target)


def run_smoke(script: str, tmp_path, workdir: bool = True) -> tuple:
    """Runs ``bench/<script> --smoke`` with its work directory (unless it has none) and JSON in
    ``tmp_path``; returns ``(completed process, the JSON it wrote)`` after checking it exited 0."""
    import json
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / script.replace(".py", ".json")
    env = dict(
        os.environ,
        PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(repo, "bench", script),
            "--smoke",
            *(("--workdir", str(tmp_path / "work")) if workdir else ()),
            "--out",
            str(out),
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, json.loads(out.read_text())


def check_figures(res: dict) -> None:
    """Every published figure's median and verdict, recomputed from its repeats by ``bench/_common.figure``."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench._common import figure

    for f in res["figures"]:
        again = figure(
            f["name"], f["values"], f["unit"], target=(f["op"], f["bound"]) if f["op"] else None
        )
        assert (again["value"], again["status"]) == (f["value"], f["status"]), f["name"]


def committed(name: str) -> dict:
    """The parsed JSON of the committed result ``bench/results/<name>.json`` (relative to the repo root)."""
    import json
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "bench", "results", f"{name}.json"), encoding="utf-8") as fh:
        return json.load(fh)


def check_roofline(roof: dict, peaks: dict) -> None:
    """A timed model's roofline: measured over a positive bound, or, where a class of its ops has
    no measured peak on this CPU (``peaks["unknown"]``, e.g. AMX's int8 tiles), no bound and no
    ratio at all (never a guess)."""
    if roof["bound_ms"] is None:
        assert roof["ratio"] is None and peaks.get("unknown"), (roof, peaks)
    else:
        assert roof["bound_ms"] > 0 and roof["ratio"] > 1, roof


def rdp_epsilon(noise: float, rate: float, steps: int, delta: float) -> float:
    """The epsilon ``dp-accounting``'s RDP accountant gives ``steps`` Poisson-sampled Gaussian
    events (noise multiplier ``noise``, sampling ``rate``) at ``delta``: called here, not through
    tfopt."""
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(noise))
    accountant.compose(event, steps)  # the event, composed steps times
    return accountant.get_epsilon(delta)
