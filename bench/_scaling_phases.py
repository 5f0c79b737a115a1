"""Benchmark B3's phases: scaling efficiency, all-reduce time, backup cost and simulated links."""

from __future__ import annotations

import os
import shutil
import time

from bench._common import (
    QuietGate,
    environment_light,
    lscpu_info,
    median,
)
from bench._scaling_params import LINK_VARIANTS, MB
from bench._scaling_sides import (
    SIDES,
    Ctx,
    _check_reports,
    _harness,
    _launch,
    _reports,
    _run_procs,
    _slim,
    _spread,
    _train_flags,
    foreign_load,
    run_side,
)


def phase_scaling(ctx: Ctx, gate: QuietGate, bar) -> dict:
    p = ctx.p

    def unit(r: int):
        order = ["a", "b", "c"] if r % 2 == 0 else ["c", "b", "a"]
        rec: dict = {"order": order}
        for side in order:
            bar.set_postfix_str(f"scaling {r + 1}/{p.repeats}: side {side}")
            rec[side] = run_side(side, ctx)
        ta, tb, tc = (rec[s]["examples_per_sec"] for s in "abc")
        rec["efficiency"] = tb / tc
        rec["weak_scaling"] = tb / (2 * ta)
        return rec, [rec[s]["foreign_load"] for s in order]

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    return {
        "model": p.model,
        "dataset": "mnist",
        "per_process_batch": p.batch,
        "warmup_steps": p.warmup_steps,
        "timed_steps": p.steps,
        "steps_per_execution": p.steps_per_execution or "auto",
        "cores": ctx.cores[:2],
        "sides": SIDES,
        "repeats": runs,
        **{f"{s}_examples_per_sec": median(x[s]["examples_per_sec"] for x in runs) for s in "abc"},
        "efficiency": median(x["efficiency"] for x in runs),
        "efficiency_range": _spread(x["efficiency"] for x in runs),
        "weak_scaling": median(x["weak_scaling"] for x in runs),
        "weak_scaling_range": _spread(x["weak_scaling"] for x in runs),
    }


# -- phase 4: links ------------------------------------------------------------------------------


def link_row(side: dict, control: dict, gbit: float, variant: str) -> dict:
    """One side b measured on two simulated hosts, beside the same repeat's control (side c).

    The bytes are the kernel's counters of each host's veth, over the timed window: what the
    workers sent each other per step (the all-reduce, plus gRPC's own messages). The ring model
    sends 2(N-1)/N x the gradient bytes per worker per step (N = 2: the gradients once).
    """
    procs = side["processes"]
    sent = [
        pr["window"]["link_tx_bytes"] / (pr["window_steps"][1] - pr["window_steps"][0])
        for pr in procs
        if "link_tx_bytes" in pr["window"]
    ]
    width = 2 if variant == "bfloat16" else 4
    model_bytes = 2 * (2 - 1) / 2 * procs[0]["trainable_values"] * width
    return {
        "gbit": gbit,
        "variant": variant,
        "examples_per_sec": side["examples_per_sec"],
        "step_ms": max(side["step_ms"]),
        "efficiency": side["examples_per_sec"] / control["examples_per_sec"],
        # None on the loopback: a process there may read the counters of the host's own eth0
        "link_bytes_per_step": median(sent) if sent and gbit else None,
        "ring_model_bytes_per_step": model_bytes,
        "ring_model_ms": 1e3 * model_bytes / (gbit * 1e9 / 8) if gbit else None,
        "side": side,
    }


def phase_links(ctx: Ctx, gate: QuietGate, bar) -> dict:
    """Side b on two simulated hosts at each link rate and variant, against the control (side c)."""
    p = ctx.p

    def unit(r: int):
        rates = list(p.link_gbits) if r % 2 == 0 else list(reversed(p.link_gbits))
        bar.set_postfix_str(f"links {r + 1}/{p.repeats}: control")
        control = run_side("c", ctx)
        rows = []
        for gbit in rates:
            for variant in p.link_variants:
                bar.set_postfix_str(f"links {r + 1}/{p.repeats}: {gbit} Gbit/s {variant}")
                flags = [f.format(pack=p.pack_bytes) for f in LINK_VARIANTS[variant]]
                hosts = ("--hosts", "2", "--link", f"{gbit}gbit") if gbit else ()
                side = run_side("b", ctx, hosts, tuple(flags))
                if gbit and not all("link_tx_bytes" in pr["window"] for pr in side["processes"]):
                    raise RuntimeError(
                        "[B3] links: the workers did not run on simulated hosts (no veth "
                        "counters); tfopt launch --hosts needs root and ip netns"
                    )
                rows.append(link_row(side, control, gbit, variant))
        loads = [control["foreign_load"]] + [x["side"]["foreign_load"] for x in rows]
        return {"control": control, "rows": rows}, loads

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    table = []
    for gbit in p.link_gbits:
        for variant in p.link_variants:
            cells = [
                x
                for run in runs
                for x in run["rows"]
                if (x["gbit"], x["variant"]) == (gbit, variant)
            ]
            table.append(
                {
                    "gbit": gbit,
                    "variant": variant,
                    "efficiency": median(x["efficiency"] for x in cells),
                    "efficiencies": [x["efficiency"] for x in cells],
                    "examples_per_sec": median(x["examples_per_sec"] for x in cells),
                    "step_ms": median(x["step_ms"] for x in cells),
                    "link_bytes_per_step": cells[0]["link_bytes_per_step"]
                    and median(x["link_bytes_per_step"] for x in cells),
                    "ring_model_bytes_per_step": cells[0]["ring_model_bytes_per_step"],
                    "ring_model_ms": cells[0]["ring_model_ms"],
                }
            )
    return {
        "model": p.model,
        "hosts": 2,
        "pack_bytes": p.pack_bytes,
        "c_examples_per_sec": median(x["control"]["examples_per_sec"] for x in runs),
        "table": table,
        "repeats": runs,
        "environment": {**environment_light(), "lscpu_flags": lscpu_info().get("flags", [])},
    }


# -- phase 2: all-reduce -----------------------------------------------------------------------


def ring_model_ms(size_bytes: float, workers: int, bandwidth_Bps: float) -> float:
    """Lower bound of a ring all-reduce: 2(N-1)/N x size / bandwidth, in ms."""
    return 1e3 * 2 * (workers - 1) / workers * size_bytes / bandwidth_Bps


def phase_allreduce(ctx: Ctx, gate: QuietGate, bar) -> dict:
    p = ctx.p
    sizes = list(p.sizes_mb)

    def unit(r: int):
        bar.set_postfix_str(f"all-reduce {r + 1}/{p.repeats}")
        wd = ctx.fresh("allreduce")
        cmd = _launch(
            ctx,
            2,
            _harness(
                "_allreduce",
                "--cores",
                f"{ctx.cores[0]},{ctx.cores[1]}",
                "--intra",
                p.intra_threads,
                "--inter",
                p.inter_threads,
                "--report-dir",
                wd,
                "--sizes-mb",
                ",".join(map(str, sizes)),
                "--warmup",
                p.allreduce_warmup,
                "--iters",
                p.allreduce_iters,
                "--collective",
                p.collective,
                "--bandwidth-mb",
                p.bandwidth_mb,
                "--copies",
                p.bandwidth_copies,
            ),
        )
        t0 = time.perf_counter()
        _run_procs([cmd], ctx, wd)
        wall = time.perf_counter() - t0
        reports = _reports(wd)
        if len(reports) != 2:
            raise RuntimeError(f"[B3] all-reduce: {len(reports)} report(s), expected 2")
        if not all(r["correct_sums"] for r in reports):
            raise RuntimeError("[B3] all-reduce: a worker got a wrong sum")
        sender = next(r for r in reports if "uni_Bps" in r["bandwidth"]["before"])
        bw = sender["bandwidth"]
        uni = bw["before"]["uni_Bps"] + bw["after"]["uni_Bps"]
        duplex = bw["before"]["duplex_Bps"] + bw["after"]["duplex_Bps"]
        bandwidth = median(uni)
        workers = reports[0]["workers"]
        rec = {
            "bandwidth_uni_Bps": uni,
            "bandwidth_duplex_Bps": duplex,
            "bandwidth_Bps": bandwidth,
            "bandwidth_duplex_median_Bps": median(duplex),
            "workers": workers,
            "sizes": {},
            "foreign_load": foreign_load(reports),
            "wall_s": round(wall, 1),
            "processes": [
                {
                    k: r[k]
                    for k in (
                        "task",
                        "core",
                        "affinity",
                        "env",
                        "threads",
                        "collective",
                        "strategy_class",
                        "window",
                    )
                }
                for r in reports
            ],
        }
        for mb in sizes:
            per_worker = [median(r["allreduce_ms"][str(mb)]) for r in reports]
            ms = max(per_worker)
            model = ring_model_ms(mb * MB, workers, bandwidth)
            rec["sizes"][str(mb)] = {
                "ms": ms,
                "ms_per_worker": per_worker,
                "ms_all": [r["allreduce_ms"][str(mb)] for r in reports],
                "model_ms": model,
                "ratio_to_model": ms / model,
                "bus_bandwidth_Bps": 2 * (workers - 1) / workers * mb * MB / (ms / 1e3),
            }
        shutil.rmtree(wd, ignore_errors=True)
        return rec, [rec["foreign_load"]]

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    summary = {}
    for mb in sizes:
        k = str(mb)
        summary[k] = {
            f: median(x["sizes"][k][f] for x in runs)
            for f in ("ms", "model_ms", "ratio_to_model", "bus_bandwidth_Bps")
        }
        summary[k]["ratio_to_model_range"] = _spread(x["sizes"][k]["ratio_to_model"] for x in runs)
    return {
        "sizes_mb": sizes,
        "dtype": "float32",
        "warmup_calls": p.allreduce_warmup,
        "timed_calls": p.allreduce_iters,
        "collective": p.collective,
        "bandwidth_copy_bytes": p.bandwidth_mb * MB,
        "cores": ctx.cores[:2],
        "repeats": runs,
        "bandwidth_Bps": median(x["bandwidth_Bps"] for x in runs),
        "bandwidth_duplex_Bps": median(x["bandwidth_duplex_median_Bps"] for x in runs),
        "sizes": summary,
    }


# -- phase 3: backup overhead -----------------------------------------------------------------


def run_backup_side(with_backups: bool, ctx: Ctx) -> dict:
    p = ctx.p
    wd = ctx.fresh("backup-on" if with_backups else "backup-off")
    pin = (
        ["--cores", ctx.cores[0], "--intra", p.intra_threads, "--inter", p.inter_threads]
        if p.backup_pinned
        else []
    )
    cmd = _harness(
        "_train",
        *pin,
        "--warmup",
        p.backup_warmup_steps,
        "--report-dir",
        wd,
        "--",
        *_train_flags(
            p,
            "one_device",
            p.backup_batch,
            p.backup_warmup_steps + p.backup_steps,
            os.path.join(wd, "run"),
            backup_every=p.backup_every if with_backups else 0,
            model=p.backup_model,
        ),
    )
    t0 = time.perf_counter()
    _run_procs([cmd], ctx, wd)
    wall = time.perf_counter() - t0
    reports = _reports(wd)
    _check_reports(reports, 1, "backup " + ("on" if with_backups else "off"))
    r = reports[0]
    shutil.rmtree(wd, ignore_errors=True)
    return {
        "step_ms": r["step_ms"],
        "backup_every": p.backup_every if with_backups else 0,
        "steps_per_execution": r["steps_per_execution"],
        "window_steps": r["window_steps"],
        "backup_steps_kept": r["backup_steps_kept"],
        "foreign_load": foreign_load(reports),
        "wall_s": round(wall, 1),
        "process": _slim(r),
    }


def backup_cost_within(executions: list, every: int) -> dict | None:
    """The cost of one backup from the backup run alone, free of run-to-run drift.

    tfopt writes a backup at the step boundary that reaches a multiple of ``every``, right after
    the clock's mark there, so an execution whose first step follows a multiple of ``every`` holds
    one backup and the others hold none. Per-backup cost = median(with) - median(without), over
    executions of the common length; percent = that cost / (``every`` steps without backups).
    None when every execution holds a backup (steps per execution = ``every``).
    """
    lengths = [e - b for b, e, _ in executions]
    if not lengths:
        return None
    n = max(set(lengths), key=lengths.count)
    with_ = [sec for b, e, sec in executions if e - b == n and b % every == 0]
    without = [sec for b, e, sec in executions if e - b == n and b % every != 0]
    if not with_ or not without:
        return None
    cost = median(with_) - median(without)
    step = median(without) / n
    return {
        "steps_per_execution": n,
        "executions_with": len(with_),
        "executions_without": len(without),
        "per_backup_ms": 1e3 * cost,
        "pct": 100.0 * cost / (every * step),
    }


def phase_backup(ctx: Ctx, gate: QuietGate, bar) -> dict:
    p = ctx.p

    def unit(r: int):
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        rec: dict = {"order": order}
        for side in order:
            bar.set_postfix_str(f"backup {r + 1}/{p.repeats}: {side}")
            rec[side] = run_backup_side(side == "on", ctx)
        rec["overhead_pct"] = 100.0 * (rec["on"]["step_ms"] / rec["off"]["step_ms"] - 1.0)
        rec["within_run"] = backup_cost_within(rec["on"]["process"]["executions"], p.backup_every)
        return rec, [rec[s]["foreign_load"] for s in order]

    runs = []
    for r in range(p.repeats):
        runs.append(gate.run(lambda r=r: unit(r)))
        bar.update(1)
    return {
        "strategy": "one_device",
        "model": p.backup_model,
        "global_batch_size": p.backup_batch,
        "backup_every": p.backup_every,
        "warmup_steps": p.backup_warmup_steps,
        "timed_steps": p.backup_steps,
        "pinned": p.backup_pinned,
        "repeats": runs,
        "off_step_ms": median(x["off"]["step_ms"] for x in runs),
        "on_step_ms": median(x["on"]["step_ms"] for x in runs),
        "overhead_pct": median(x["overhead_pct"] for x in runs),
        "overhead_pct_range": _spread(x["overhead_pct"] for x in runs),
        "within_run_per_backup_ms": median(
            x["within_run"]["per_backup_ms"] for x in runs if x["within_run"]
        ),
        "within_run_pct": median(x["within_run"]["pct"] for x in runs if x["within_run"]),
    }
