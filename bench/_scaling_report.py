"""Benchmark B3's figures, checks and markdown report."""

from __future__ import annotations

import math

from bench._common import (
    figure,
    markdown_table,
    median,
    status,
)
from bench._scaling_params import TARGETS, Params

# -- report ----------------------------------------------------------------------------------------


def figures(res: dict) -> list[dict]:
    """The published B3 figures (``bench/_common.figure``), one value per repeat."""
    sc, ar, bk = res.get("scaling"), res.get("allreduce"), res.get("backup")
    out = []
    if sc:
        runs = sc["repeats"]
        out.append(
            figure(
                "efficiency: 2 MWMS workers / 2 independent processes (the control)",
                [x["efficiency"] for x in runs],
                "x",
                target=TARGETS["efficiency"],
                digits=3,
                anchor="Horovod: ~0.90",
                detail=f"{sc['b_examples_per_sec']:.0f} vs {sc['c_examples_per_sec']:.0f} ex/s",
            )
        )
        out.append(
            figure(
                "(info) weak scaling: 2 MWMS workers / (2 x 1 pinned process)",
                [x["weak_scaling"] for x in runs],
                "x",
                digits=3,
            )
        )
    if ar:
        for mb in ar["sizes_mb"]:
            out.append(
                figure(
                    f"(info) all-reduce {mb} MB, measured / ring model 2(N-1)/N x size / bandwidth",
                    [x["sizes"][str(mb)]["ratio_to_model"] for x in ar["repeats"]],
                    "x",
                    digits=1,
                    anchor="ring all-reduce: >= 1x the model",
                    detail=f"{ar['sizes'][str(mb)]['ms']:.2f} ms vs {ar['sizes'][str(mb)]['model_ms']:.2f} ms",
                )
            )
    for row in (res.get("links") or {}).get("table", []):
        where = (
            f"on 2 simulated hosts, {row['gbit']:g} Gbit/s link"
            if row["gbit"]
            else "on one host's loopback (same run)"
        )
        sent = (
            f"{row['link_bytes_per_step'] / 1e6:.2f} MB/step sent on the link (ring model "
            f"{row['ring_model_bytes_per_step'] / 1e6:.2f} MB, {row['ring_model_ms']:.2f} ms at the rate); "
            if row["gbit"]
            else ""
        )
        out.append(
            figure(
                f"(info) efficiency, 2 MWMS workers {where}, {row['variant']} all-reduce",
                row["efficiencies"],
                "x",
                digits=3,
                anchor="Horovod: ~0.90 (GPUs over RoCE)",
                detail=f"{sent}{row['step_ms']:.0f} ms/step",
            )
        )
    if bk:
        out.append(
            figure(
                f"backup overhead per step, --backup-every {bk['backup_every']} vs none",
                [x["overhead_pct"] for x in bk["repeats"]],
                "%",
                target=TARGETS["backup_overhead_pct"],
                detail=f"{bk['on_step_ms']:.1f} vs {bk['off_step_ms']:.1f} ms/step",
            )
        )
        out.append(
            figure(
                "(info) the same inside the backup run: executions with vs without a backup",
                [x["within_run"]["pct"] for x in bk["repeats"] if x["within_run"]],
                "%",
            )
        )
    return out


def _check(key: str, value) -> bool | None:
    op, bound = TARGETS[key]
    if value is None or math.isnan(value):
        return None
    return value >= bound if op == ">=" else value <= bound


def report(res: dict, p: Params) -> str:
    sc, ar, bk = res.get("scaling"), res.get("allreduce"), res.get("backup")
    R = p.repeats

    def rng(v, fmt):
        return f" (range {fmt.format(v[0])} to {fmt.format(v[1])})" if len(v) == 2 and R > 1 else ""

    rows = []
    if sc:
        rows.append(
            [
                "efficiency: 2 MWMS workers / 2 independent processes (control)",
                f"{sc['efficiency']:.3f}",
                ">= 0.90",
                status(res["targets"]["efficiency"]["pass"]),
                f"b {sc['b_examples_per_sec']:.0f} ex/s vs c {sc['c_examples_per_sec']:.0f} ex/s"
                + rng(sc["efficiency_range"], "{:.3f}"),
            ]
        )
        rows.append(
            [
                "(info) weak scaling: 2 MWMS workers / (2 x 1 pinned process)",
                f"{sc['weak_scaling']:.3f}",
                "-",
                "-",
                f"a {sc['a_examples_per_sec']:.0f} ex/s" + rng(sc["weak_scaling_range"], "{:.3f}"),
            ]
        )
    if bk:
        rows.append(
            [
                f"backup overhead per step, --backup-every {bk['backup_every']}",
                f"{bk['overhead_pct']:.2f}%",
                "<= 3%",
                status(res["targets"]["backup_overhead_pct"]["pass"]),
                f"{bk['on_step_ms']:.1f} vs {bk['off_step_ms']:.1f} ms/step"
                + rng(bk["overhead_pct_range"], "{:.2f}%"),
            ]
        )
        rows.append(
            [
                "(info) the same from inside the backup run: executions with vs without a backup",
                f"{bk['within_run_pct']:.2f}%",
                "-",
                "-",
                f"{bk['within_run_per_backup_ms']:.0f} ms per backup, one every {bk['backup_every']} steps",
            ]
        )
    parts = []
    if rows:
        parts.append(
            markdown_table(
                ["B3 multi-worker scaling", f"median of {R}", "target", "status", "detail"], rows
            )
        )
    if ar:
        arows = [
            [
                f"{mb} MB",
                f"{ar['sizes'][str(mb)]['ms']:.2f}",
                f"{ar['sizes'][str(mb)]['model_ms']:.2f}",
                f"{ar['sizes'][str(mb)]['ratio_to_model']:.2f}x",
                f"{ar['sizes'][str(mb)]['bus_bandwidth_Bps'] / 1e9:.2f}",
            ]
            for mb in ar["sizes_mb"]
        ]
        parts.append(
            markdown_table(
                [
                    "all-reduce, 2 workers, float32",
                    "measured ms",
                    "ring model ms",
                    "measured / model",
                    "bus GB/s",
                ],
                arows,
            )
        )
    lk = res.get("links")
    if lk:
        parts.append(
            markdown_table(
                [
                    "2 MWMS workers on 2 simulated hosts",
                    "efficiency",
                    "ex/s",
                    "ms/step",
                    "MB/step on the link",
                    "ring model MB",
                    "ring model ms",
                ],
                [
                    [
                        f"{row['gbit']:g} Gbit/s, {row['variant']}"
                        if row["gbit"]
                        else f"loopback, {row['variant']}",
                        f"{row['efficiency']:.3f}",
                        f"{row['examples_per_sec']:.0f}",
                        f"{row['step_ms']:.0f}",
                        f"{row['link_bytes_per_step'] / 1e6:.2f}" if row["gbit"] else "-",
                        f"{row['ring_model_bytes_per_step'] / 1e6:.2f}",
                        f"{row['ring_model_ms']:.2f}" if row["gbit"] else "-",
                    ]
                    for row in lk["table"]
                ],
            )
        )
    notes = []
    if p.smoke:
        notes.append(
            "SMOKE MODE: tiny batches and step counts, one repeat; these figures mean nothing."
        )
    kept = res.get("kept_from")
    if kept and kept.get("phases"):
        notes.append(
            f"Kept from the run of {kept['date_utc'][:10]} on {kept['cpu']}: the "
            f"{', '.join(kept['phases'])} phase(s); the rest measured now, on the machine below."
        )
    env = res["environment"]
    notes.append(
        f"{env['processor']}, {env['usable_cores']} usable cores (cores {res['cores'][:2]} used), "
        f"TF {env.get('tensorflow')}; medians over {R} repeats, sides interleaved."
    )
    if sc:
        notes.append(
            f"Scaling: `{p.model}` on MNIST, B = {p.batch} per process, {p.warmup_steps} warm-up + {p.steps} timed "
            f"steps per process on every side; throughput = examples/s over the timed window (b: {2 * p.batch} per "
            "global step of the slower worker; a, c: sum of the processes). Processes pinned with "
            f"sched_setaffinity before TensorFlow starts, TF_NUM_INTRAOP_THREADS={p.intra_threads}, "
            f"TF_NUM_INTEROP_THREADS={p.inter_threads}; c's windows overlapped "
            f"{100 * median(x['c'].get('window_overlap', float('nan')) for x in sc['repeats']):.0f}% (median)."
        )
    if ar:
        notes.append(
            f"All-reduce: median of {p.allreduce_iters} timed calls after {p.allreduce_warmup} warm-up per size "
            f"(collective={p.collective}); model = 2(N-1)/N x size / loopback TCP bandwidth "
            f"{ar['bandwidth_Bps'] / 1e9:.2f} GB/s (one direction; {ar['bandwidth_duplex_Bps'] / 1e9:.2f} GB/s per "
            f"direction when both send at once), measured between the same two pinned processes with "
            f"{p.bandwidth_mb} MB copies."
        )
    if lk:
        notes.append(
            f"Links: side b launched with `tfopt launch --hosts 2 --link RATE`, each worker in a network "
            "namespace of its own, joined through a bridge by veth pairs shaped with tc (tbf) each way; "
            f"efficiency against the same repeat's control (c, {lk['c_examples_per_sec']:.0f} ex/s). "
            "MB/step: bytes each worker sent on its veth over the timed window (the kernel's counters), "
            "per step; ring model: 2(N-1)/N x gradient bytes per worker, and that over the link rate. "
            f"packed: --bytes-per-pack {lk['pack_bytes']}; bfloat16: --allreduce-dtype bfloat16."
        )
    if bk:
        spe_on = sorted({n for x in bk["repeats"] for n in x["on"]["steps_per_execution"]})
        spe_off = sorted({n for x in bk["repeats"] for n in x["off"]["steps_per_execution"]})
        notes.append(
            f"Backups: one_device, `{p.backup_model}`, batch {p.backup_batch}, "
            f"{'pinned to 1 core' if p.backup_pinned else 'unpinned (default threads)'}, {p.backup_warmup_steps} "
            f"warm-up + {p.backup_steps} timed in-epoch steps; steps per execution (tfopt's choice) "
            f"{spe_on} with backups, {spe_off} without."
        )
    q = res["quiet_gate"]
    notes.append(
        (
            f"Shared machine: repeats re-run when other processes used > {100 * q['threshold']:.0f}% of the "
            "cores "
            if q["enabled"]
            else "Shared machine: re-running disturbed repeats was off "
        )
        + f"({q['reruns']} re-runs, {q['extra_seconds']:.0f} s waiting and re-running, "
        f"{q['kept_disturbed_units']} of {q['units']} repeats kept disturbed); foreign load in kept "
        f"samples: median {100 * q['kept_foreign_load_median']:.0f}%, "
        f"max {100 * q['kept_foreign_load_max']:.0f}%."
    )
    notes.append(
        "Physical limit: 2 cores cap compute parallelism at 2x; each worker's all-reduce (its gRPC and "
        "collective threads) runs on the worker's one core, between its compute."
    )
    return "\n\n".join(parts) + "\n\n" + "\n".join("- " + n for n in notes)
