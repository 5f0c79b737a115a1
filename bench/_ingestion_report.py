"""Benchmark B1's figures and markdown report."""

from __future__ import annotations

from bench._common import (
    figure,
    markdown_table,
    usable_cores,
)
from bench._ingestion_params import ANCHORS, TARGETS, Params

# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def figures(res: dict) -> list[dict]:
    """The published figures, each from its per-repeat values (bench/_common.figure)."""
    th, ib, at = res["throughput"], res["input_bound"], res["autotune"]
    tr, ir = th["repeats"], ib["repeats"]

    def vals(rows, key):
        return [x[key] for x in rows]

    return [
        figure(
            "epoch 1 (cold) input throughput, tfopt / naive",
            vals(tr, "epoch1_ratio"),
            "x",
            target=TARGETS["epoch1_ratio"],
            anchor=ANCHORS["epoch1_ratio"],
            peer=f"tf.data guide pipeline: {th['guide_epoch1_ips']:,.0f} img/s "
            f"(tfopt / guide {th['epoch1_ratio_vs_guide']:.2f}x)",
            detail=f"naive {th['naive_epoch1_ips']:,.0f} img/s, tfopt {th['tfopt_epoch1_ips']:,.0f} img/s",
        ),
        figure(
            "cached epochs input throughput, tfopt / naive",
            vals(tr, "cached_ratio"),
            "x",
            target=TARGETS["cached_ratio"],
            anchor=ANCHORS["cached_ratio"],
            peer=f"tf.data guide pipeline: {th['guide_cached_ips']:,.0f} img/s "
            f"(tfopt / guide {th['cached_ratio_vs_guide']:.2f}x)",
            detail=f"naive {th['naive_epoch2_ips']:,.0f} img/s, tfopt {th['tfopt_cached_ips']:,.0f} img/s",
        ),
        figure(
            "input-bound fraction of a train step (cached epochs)",
            vals(ir, "tfopt_input_bound_pct"),
            "%",
            target=TARGETS["input_bound_pct"],
            anchor=ANCHORS["input_bound_pct"],
            digits=1,
            peer=f"tf.data guide pipeline: {ib['guide_input_bound_pct']:.1f}%",
            detail=f"{ib['tfopt_step_ms']:.1f} ms/step real vs {ib['ideal_step_ms']:.1f} ms ideal",
        ),
        figure(
            "AUTOTUNE gap vs best hand config (cache off)",
            vals(at["confirm"], "gap_pct"),
            "%",
            target=TARGETS["autotune_gap_pct"],
            anchor=ANCHORS["autotune_gap_pct"],
            digits=1,
            peer="the guide sets every knob to AUTOTUNE too",
            detail=f"AUTOTUNE {at['autotune_ips']:,.0f} vs {at['best_hand']} {at['best_hand_ips']:,.0f} img/s",
        ),
        figure(
            "(info) epoch 1, tfopt / tf.data guide pipeline",
            vals(tr, "epoch1_ratio_vs_guide"),
            "x",
            detail=f"guide {th['guide_epoch1_ips']:,.0f} img/s",
        ),
        figure(
            "(info) cached epochs, tfopt / tf.data guide pipeline",
            vals(tr, "cached_ratio_vs_guide"),
            "x",
            detail=f"guide {th['guide_cached_ips']:,.0f} img/s",
        ),
        figure(
            "(info) input-bound fraction, tf.data guide pipeline (cached epochs)",
            vals(ir, "guide_input_bound_pct"),
            "%",
            digits=1,
            detail=f"{ib['guide_step_ms']:.1f} ms/step vs {ib['ideal_step_ms']:.1f} ms ideal",
        ),
        figure(
            "(info) epoch 1, tfopt / naive with tf.data's automatic rewrites off",
            vals(tr, "epoch1_ratio_vs_options_off"),
            "x",
            detail=f"naive, options off {th['naive_options_off_epoch1_ips']:,.0f} img/s",
        ),
        figure(
            "(info) input-bound fraction, tfopt epoch 1 (cold cache)",
            vals(ib["epoch1"]["repeats"], "input_bound_pct"),
            "%",
            digits=1,
            detail=f"{ib['epoch1']['real_epoch1_step_ms']:.1f} ms/step vs "
            f"{ib['epoch1']['ideal_step_ms']:.1f} ms ideal",
        ),
    ]


def report(res: dict, p: Params) -> str:
    """The markdown table of the figures, then notes on how they were measured."""
    ib, at, q = res["input_bound"], res["autotune"], res["quiet_gate"]
    rows = []
    for f in res["figures"]:
        unit = f["unit"]
        fmt = lambda v: f"{v:.{f['digits']}f}{unit}"  # noqa: E731
        spread = f"{fmt(f['spread'][0])} to {fmt(f['spread'][1])}" if f["repeats"] > 1 else "-"
        rows.append(
            [
                f["name"],
                fmt(f["value"]) if f["value"] is not None else "-",
                spread,
                f["target"] or "-",
                f["status"],
                f["peer"] or "-",
                f["detail"] or "",
            ]
        )
    table = markdown_table(
        [
            "B1 ingestion",
            f"median of {p.repeats}",
            "range",
            "target",
            "status",
            "peer, same run",
            "detail",
        ],
        rows,
    )
    n_hand = len(at["sweep_best_ips"]) - 1
    k = p.trials
    notes = [
        f"{res['dataset']['images']} JPEGs ({res['dataset']['mean_jpeg_bytes']} B mean, "
        f"{p.min_side}-{p.max_side} px) in {res['dataset']['shards']} TFRecord shards; decode + resize "
        f"{p.resize} + random crop {p.crop} + flip + normalize; batch {p.batch_size}; "
        f"{usable_cores()} usable cores; TF {res['environment'].get('tensorflow')}.",
        f"Each figure: median over {p.repeats} repeats; in a repeat each side runs {k} interleaved trials and "
        f"its best is kept (other tenants only ever slow a run down). Cached = median of the {p.cached_epochs} "
        "epochs after epoch 1; epoch 1 = empty tf.data cache (OS page cache warm for all); naive has no "
        "cache, its epoch 2 is the baseline for cached epochs.",
        "tfopt: tfopt.data.build with data.augment=crop_flip (library code: per-batch gather + flip + "
        "normalize, "
        + ("XLA-compiled" if res["augment_xla"] else "plain TF ops (XLA unavailable)")
        + ", after the cache and a full-split shuffle); naive and guide: bench/peers/tf_data_guide.py "
        "(tf.image.random_crop / random_flip_left_right per example; the guide does not shuffle). "
        f"tfopt's one-time tracing + XLA compilation of the augmentation ({res['augment_first_batch_seconds']:.2f} s, "
        "once per process) happens before anything is timed.",
        f"Step model: {ib['model_desc']} ({ib['model_params']:,} params); trials are 1-epoch fits "
        f"({ib['steps_per_epoch']} steps) on the cached pipelines.",
        f"AUTOTUNE gap: the best of {n_hand} hand configs (best of {p.repeats} sweep epochs each; sweep gap "
        f"{at['sweep_gap_pct']:.1f}%) re-measured against AUTOTUNE in {p.repeats} repeats x {k} interleaved "
        "trials; positive = AUTOTUNE slower. Augment parallelism is AUTOTUNE in every config.",
        f"Physical limit: {res['environment']['usable_cores']} cores cap compute parallelism at "
        f"{res['environment']['usable_cores']}x; more only from overlapping waits, vectorizing and caching.",
        (
            f"Shared machine: units re-run when other processes used > {100 * q['threshold']:.0f}% of the cores "
            if q["enabled"]
            else "Shared machine: re-running disturbed units was off "
        )
        + f"({q['reruns']} re-runs, {q['extra_seconds']:.0f} s spent waiting and re-running, "
        f"{q['kept_disturbed_units']} of {q['units']} units kept disturbed); foreign load in kept samples: "
        f"median {100 * q['kept_foreign_load_median']:.0f}%, max {100 * q['kept_foreign_load_max']:.0f}%.",
    ]
    if p.smoke:
        notes.insert(0, "SMOKE MODE: tiny data, one repeat, one trial; these figures mean nothing.")
    return table + "\n\n" + "\n".join("- " + n for n in notes)
