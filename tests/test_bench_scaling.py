"""Keeps benchmark B3 (bench/scaling.py) runnable and honest: its ``--smoke`` mode end to end.

Not a performance test: the smoke figures mean nothing. It checks that the script runs every
side for real (pinned processes, a 2-worker MultiWorkerMirrored job, backups on disk), that every
figure is in the JSON, and that each published ratio is recomputed here from the raw figures the
JSON also holds, so a broken benchmark (a ratio of the wrong numbers, a side that did not run,
times that do not grow with the tensor size) fails.
"""

import json
import os
import subprocess
import sys

import pytest
from bench_checks import check_verdicts, committed
from isolation import ISOLATED

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _median(values):
    vals = sorted(values)
    n = len(vals)
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2


@pytest.mark.slow
@pytest.mark.bench
def test_scaling_benchmark_smoke(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("B3 pins its processes to two distinct cores")
    out = tmp_path / "scaling.json"
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env.pop("TF_CONFIG", None)
    # The whole benchmark in a private network namespace where the kernel allows (it starts TF servers).
    proc = subprocess.run(
        [
            *ISOLATED,
            sys.executable,
            os.path.join(REPO, "bench", "scaling.py"),
            "--smoke",
            "--isolate",
            "off",
            "--workdir",
            str(tmp_path / "new"),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "| B3 multi-worker scaling" in proc.stdout and "| all-reduce, 2 workers" in proc.stdout
    assert "| 2 MWMS workers on 2 simulated hosts" in proc.stdout

    res = json.loads(out.read_text())
    assert res["params"]["smoke"] is True
    # the smoke links phase: one repeat, one row (1 Gbit/s, packed)
    [rep] = res["links"]["repeats"]
    assert [(row["gbit"], row["variant"]) for row in rep["rows"]] == [(1, "packed")]
    check_result(res)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("b3-")]  # scratch removed


def check_result(res: dict) -> None:
    """Everything a B3 result must get right whatever its figures (a smoke run's or a full run's)."""
    p = res["params"]
    assert res["id"] == "B3" and res["phases"] == ["scaling", "allreduce", "backup", "links"]
    assert res["lscpu"]["flags"] and res["environment"]["tensorflow"]
    c0, c1 = res["cores"][:2]
    assert c0 != c1

    # -- scaling: every side ran as described, and the ratios are the throughputs' ratios ------
    # the benchmark's own formula, also checked against first principles below
    from bench.scaling import side_throughput

    sc = res["scaling"]
    assert len(sc["repeats"]) == p["repeats"]
    for rep in sc["repeats"]:
        a, b, c = rep["a"], rep["b"], rep["c"]
        assert [len(s["processes"]) for s in (a, b, c)] == [1, 2, 2]
        assert [pr["strategy"] for pr in b["processes"]] == ["multi_worker_mirrored"] * 2
        assert {pr["strategy"] for pr in a["processes"] + c["processes"]} == {"one_device"}
        assert a["processes"][0]["affinity"] == [c0]
        for side in (b, c):  # each process of a 2-process side pinned to its own core
            assert sorted(pr["affinity"][0] for pr in side["processes"]) == sorted([c0, c1])
            assert all(len(pr["affinity"]) == 1 for pr in side["processes"])
        for side, global_batch in ((a, p["batch"]), (b, 2 * p["batch"]), (c, p["batch"])):
            for pr in side["processes"]:
                assert pr["global_batch_size"] == global_batch
                assert pr["env"]["TF_NUM_INTRAOP_THREADS"] == str(p["intra_threads"])
                s0, s1 = pr["window_steps"]
                assert (
                    s0 >= p["warmup_steps"] and s1 == p["warmup_steps"] + p["steps"]
                )  # equal training
                # the per-step time is the timed window over its steps
                assert pr["step_ms"] == pytest.approx(
                    1e3 * pr["window"]["seconds"] / (s1 - s0), rel=0.02
                )
            assert side["step_ms"] == [pr["step_ms"] for pr in side["processes"]]
            assert side["examples_per_sec"] > 0
        # throughput from first principles: B examples per step per process; b's workers in lockstep
        assert a["examples_per_sec"] == pytest.approx(1e3 * p["batch"] / a["step_ms"][0])
        assert c["examples_per_sec"] == pytest.approx(
            sum(1e3 * p["batch"] / ms for ms in c["step_ms"])
        )
        assert b["examples_per_sec"] == pytest.approx(1e3 * 2 * p["batch"] / max(b["step_ms"]))
        for side in (a, b, c):
            assert side["examples_per_sec"] == pytest.approx(
                side_throughput(side["step_ms"], side["batch_per_process"], side["combine"])
            )
        assert rep["efficiency"] == pytest.approx(b["examples_per_sec"] / c["examples_per_sec"])
        assert rep["weak_scaling"] == pytest.approx(
            b["examples_per_sec"] / (2 * a["examples_per_sec"])
        )
        assert 0 < rep["efficiency"] < 5 and 0 < c["window_overlap"] <= 1
    assert sc["efficiency"] == pytest.approx(_median(r["efficiency"] for r in sc["repeats"]))
    assert sc["weak_scaling"] == pytest.approx(_median(r["weak_scaling"] for r in sc["repeats"]))
    assert sc["c_examples_per_sec"] > 0

    # -- all-reduce: grows with the size; the model is the ring formula on the measured bandwidth --
    ar = res["allreduce"]
    assert ar["sizes_mb"] == [1, 4, 16, 64]
    for rep in ar["repeats"]:
        bw = rep["bandwidth_Bps"]
        assert bw > 0 and rep["workers"] == 2
        assert bw == pytest.approx(_median(rep["bandwidth_uni_Bps"]))
        assert len(rep["bandwidth_uni_Bps"]) == 2 * p["bandwidth_copies"]
        assert sorted(pr["affinity"][0] for pr in rep["processes"]) == sorted([c0, c1])
        times = [rep["sizes"][str(mb)]["ms"] for mb in ar["sizes_mb"]]
        assert all(t > 0 for t in times) and times == sorted(times) and times[-1] > times[0], times
        for mb in ar["sizes_mb"]:
            row = rep["sizes"][str(mb)]
            assert len(row["ms_all"]) == 2 and all(
                len(v) == p["allreduce_iters"] for v in row["ms_all"]
            )
            assert row["ms"] == pytest.approx(max(_median(v) for v in row["ms_all"]))
            model_ms = 1e3 * 2 * (2 - 1) / 2 * mb * 2**20 / bw
            assert row["model_ms"] == pytest.approx(model_ms)
            assert row["ratio_to_model"] == pytest.approx(row["ms"] / model_ms)
            assert row["bus_bandwidth_Bps"] == pytest.approx(mb * 2**20 / (row["ms"] / 1e3))
    for mb in ar["sizes_mb"]:
        assert ar["sizes"][str(mb)]["ms"] == pytest.approx(
            _median(r["sizes"][str(mb)]["ms"] for r in ar["repeats"])
        )

    # -- backups: written mid-epoch at the interval on one side only; overhead from the step times --
    bk = res["backup"]
    every = p["backup_every"]
    for rep in bk["repeats"]:
        on, off = rep["on"], rep["off"]
        assert off["backup_steps_kept"] == [] and off["backup_every"] == 0
        kept = on["backup_steps_kept"]
        s0, s1 = on["window_steps"]
        assert (
            kept and all(k % every == 0 for k in kept) and max(kept) < s1
        )  # mid-epoch, not epoch-end
        assert all(every % n == 0 for n in on["steps_per_execution"])  # steps land on the backups
        assert on["process"]["backup_every"] == every
        assert rep["overhead_pct"] == pytest.approx(100 * (on["step_ms"] / off["step_ms"] - 1))
        assert on["step_ms"] > 0 and off["step_ms"] > 0
        # within the backup run: the executions that start where a backup was written vs the others
        ex = on["process"]["executions"]
        assert ex[0][0] == s0 and ex[-1][1] == s1
        assert on["step_ms"] == pytest.approx(
            1e3 * sum(sec for _, _, sec in ex) / (s1 - s0), rel=0.02
        )
        n = on["steps_per_execution"][0]
        with_ = [sec for b, e, sec in ex if b % every == 0 and e - b == n]
        without = [sec for b, e, sec in ex if b % every and e - b == n]
        assert with_ and without  # smoke's interval leaves executions of both kinds
        w = rep["within_run"]
        assert w["per_backup_ms"] == pytest.approx(1e3 * (_median(with_) - _median(without)))
        assert w["pct"] == pytest.approx(
            100 * (_median(with_) - _median(without)) / (every * _median(without) / n)
        )
    assert bk["overhead_pct"] == pytest.approx(_median(r["overhead_pct"] for r in bk["repeats"]))

    # -- links: the workers on two simulated hosts; the link's counters carry the all-reduce ---------
    lk = res["links"]
    assert len(lk["repeats"]) == p["repeats"]
    cells = [(gbit, variant) for gbit in p["link_gbits"] for variant in p["link_variants"]]
    for rep in lk["repeats"]:
        assert sorted((row["gbit"], row["variant"]) for row in rep["rows"]) == sorted(cells)
        for row in rep["rows"]:
            gbit, variant = row["gbit"], row["variant"]
            workers = row["side"]["processes"]
            packed = p["pack_bytes"] if variant == "packed" else 0
            assert [pr["runtime"]["bytes_per_pack"] for pr in workers] == [packed] * 2, row
            width = 2 if variant == "bfloat16" else 4  # the all-reduce's bytes per value
            values = workers[0]["trainable_values"]
            # N = 2: every gradient once
            assert row["ring_model_bytes_per_step"] == width * values
            assert row["ring_model_ms"] == (
                pytest.approx(1e3 * width * values / (gbit * 1e9 / 8)) if gbit else None
            )
            # Each worker sends at least the ring model's bytes (what the all-reduce must move), and
            # not much more (the rest of gRPC's messages): the counters are those of the link
            # between them (none on the loopback, where they would be the host's own eth0).
            if gbit:
                for pr in workers:
                    sent = pr["window"]["link_tx_bytes"] / (
                        pr["window_steps"][1] - pr["window_steps"][0]
                    )
                    assert 1.0 <= sent / (width * values) < 1.5, (gbit, variant, sent)
            else:
                assert row["link_bytes_per_step"] is None
            assert row["efficiency"] == pytest.approx(
                row["examples_per_sec"] / rep["control"]["examples_per_sec"]
            )
    # the table: per link rate and variant, the median over the repeats
    assert [(t["gbit"], t["variant"]) for t in lk["table"]] == cells
    for t in lk["table"]:
        effs = [
            row["efficiency"]
            for rep in lk["repeats"]
            for row in rep["rows"]
            if (row["gbit"], row["variant"]) == (t["gbit"], t["variant"])
        ]
        assert t["efficiencies"] == effs and t["efficiency"] == _median(effs)

    # -- verdicts ------------------------------------------------------------------------------------
    targets = res["targets"]
    assert set(targets) == {"efficiency", "backup_overhead_pct"}
    assert targets["efficiency"]["measured"] == sc["efficiency"]
    assert targets["backup_overhead_pct"]["measured"] == bk["overhead_pct"]
    check_verdicts(targets)


def test_the_committed_scaling_result_holds_together():
    check_result(committed("scaling"))


def test_a_link_row_counts_bytes_only_on_simulated_hosts():
    """On the loopback a worker may read the host's own eth0 counters: they are not the link's."""
    from bench.scaling import link_row

    def side(tx):
        proc = {
            "window": {"link_tx_bytes": tx},
            "window_steps": [10, 20],
            "trainable_values": 1000,
        }
        return {"processes": [proc, proc], "examples_per_sec": 80.0, "step_ms": [50.0, 51.0]}

    control = {"examples_per_sec": 100.0}
    on_hosts = link_row(side(41000), control, 1, "bfloat16")
    assert on_hosts["link_bytes_per_step"] == 4100  # 41000 bytes over 10 steps
    assert on_hosts["ring_model_bytes_per_step"] == 2000  # N = 2: 1000 values x 2 bytes, once
    assert on_hosts["ring_model_ms"] == pytest.approx(1e3 * 2000 / (1e9 / 8))
    assert on_hosts["efficiency"] == pytest.approx(0.8) and on_hosts["step_ms"] == 51.0
    loopback = link_row(side(41000), control, 0, "float32")
    assert loopback["link_bytes_per_step"] is None and loopback["ring_model_ms"] is None
