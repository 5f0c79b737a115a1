"""Benchmark B5's summary, verdicts and markdown report."""

from __future__ import annotations

import dataclasses

from bench._common import (
    figure,
    figures_table,
    markdown_table,
    median,
    result,
    speedups,
)
from bench._tflite_ptq_params import ANCHOR_SIZE, ANCHOR_SPEED, COMMAND, SETTINGS, TARGETS, Params
from bench.peers import ptq_tutorial, qat_example


def _verdict(key: str, got) -> dict:
    op, bound = TARGETS[key]
    ok = None if got is None or got != got else (got >= bound if op == ">=" else got <= bound)
    return {"op": op, "value": bound, "measured": got, "pass": ok}


def summarize(p: Params, families: dict, peers: dict, per: dict) -> dict:
    out_families, targets, figures = {}, {}, []
    peer_rows = {}
    for peer, r in peers.items():
        base = f"{peer}/float32"
        peer_rows[peer] = {
            **{k: v for k, v in r.items() if k not in ("float32", "int8")},
            **{
                mode: {
                    "size_bytes": len(r[mode]["content"]),
                    "accuracy": r[mode]["accuracy"],
                    "latency": speedups(per, f"{peer}/{mode}", base, SETTINGS),
                }
                for mode in ("float32", "int8")
            },
        }
        row = peer_rows[peer]
        row["int8_size_ratio"] = row["float32"]["size_bytes"] / row["int8"]["size_bytes"]
        row["int8_accuracy_loss_pt"] = round(
            100 * (r["keras_test_accuracy"] - r["int8"]["accuracy"]), 3
        )
    ptq_peer, qat_peer = peer_rows.get("ptq_tutorial"), peer_rows.get("qat_example")

    def peer_text(what: str) -> str | None:
        if ptq_peer is None:
            return None
        if what == "speed":
            return (
                f"{ptq_tutorial.TUTORIAL} (its {ptq_peer['params']:,}-param CNN, uint8 I/O): int8 "
                f"{ptq_peer['int8']['latency']['xnnpack/1t']['speedup_vs_float32']:.2f}x vs its float"
            )
        if what == "size":
            return f"{ptq_tutorial.TUTORIAL}: int8 {ptq_peer['int8_size_ratio']:.2f}x smaller than its float"
        if what == "accuracy":
            return f"{ptq_tutorial.TUTORIAL}: int8 loses {ptq_peer['int8_accuracy_loss_pt']:.2f} pt vs its Keras model"
        return (
            f"{qat_example.TUTORIAL}: QAT .tflite loses {qat_peer['int8_accuracy_loss_pt']:.2f} pt vs its float "
            f"baseline (not equally trained), {qat_peer['int8_size_ratio']:.2f}x smaller"
        )

    for name, fam in families.items():
        rows = {}
        keras_acc = fam["keras_test_accuracy"]
        f32 = fam["rows"]["float32"]
        names = list(fam["rows"]) + (["qat-int8"] if fam["qat"] else [])
        for mode in names:
            if mode == "qat-int8":
                q = fam["qat"][0]
                row = {
                    "size_bytes": q["size_bytes"],
                    "eval": {"accuracy": q["qat_tflite_accuracy"], "agreement": q["qat_agreement"]},
                }
            else:
                row = {k: v for k, v in fam["rows"][mode].items() if k != "content"}
            rows[mode] = {
                **row,
                "size_ratio_vs_float32": f32["size_bytes"] / row["size_bytes"],
                "accuracy_loss_vs_keras_pt": round(100 * (keras_acc - row["eval"]["accuracy"]), 3),
                "latency_interleaved": speedups(per, f"{name}/{mode}", f"{name}/float32", SETTINGS),
            }
        auto_row = rows["int8_auto"]
        lat = auto_row["latency_interleaved"]["xnnpack/1t"]
        qat_losses = [q["loss_pt"] for q in fam["qat"]]
        measured = {
            "int8_auto_speedup_1t": lat["speedup_vs_float32"],
            "int8_auto_size_ratio": auto_row["size_ratio_vs_float32"],
            "int8_auto_accuracy_loss_pt": auto_row["accuracy_loss_vs_keras_pt"],
            "qat_accuracy_loss_pt": median(qat_losses) if qat_losses else None,
        }
        targets[name] = {k: _verdict(k, v) for k, v in measured.items()}
        int8_lat = rows["int8"]["latency_interleaved"]["xnnpack/1t"]
        kept = ", ".join(auto_row["float_nodes"]) or "none"
        figures += [
            figure(
                f"{name}: int8_auto speedup vs float32 (LiteRT XNNPACK, 1 thread, batch 1)",
                lat["speedup_rounds"],
                "x",
                target=TARGETS["int8_auto_speedup_1t"],
                peer=peer_text("speed"),
                anchor=ANCHOR_SPEED,
                detail=f"p50 {1e3 * lat['p50_ms']:.1f} us vs float32 "
                f"{1e3 * rows['float32']['latency_interleaved']['xnnpack/1t']['p50_ms']:.1f} us; "
                f"kept in float: {kept}; plain int8 {int8_lat['speedup_vs_float32']:.2f}x",
            ),
            figure(
                f"{name}: full-integer int8 speedup vs float32 (1 thread)",
                int8_lat["speedup_rounds"],
                "x",
                detail="the plain converter's int8, for comparison with int8_auto",
            ),
            figure(
                f"{name}: int8_auto speedup vs float32 (2 threads)",
                auto_row["latency_interleaved"]["xnnpack/2t"]["speedup_rounds"],
                "x",
            ),
            figure(
                f"{name}: int8_auto size, float32 / int8_auto file bytes (--strip-strings)",
                [auto_row["size_ratio_vs_float32"]],
                "x",
                target=TARGETS["int8_auto_size_ratio"],
                peer=peer_text("size"),
                anchor=ANCHOR_SIZE,
                detail=f"{f32['size_bytes']:,} / {auto_row['size_bytes']:,} bytes; unstripped float32 / int8 "
                f"{fam['plain_sizes']['float32']:,} / {fam['plain_sizes']['int8']:,} bytes",
            ),
            figure(
                f"{name}: int8_auto accuracy loss vs the Keras model (PTQ)",
                [auto_row["accuracy_loss_vs_keras_pt"]],
                "pt",
                target=TARGETS["int8_auto_accuracy_loss_pt"],
                peer=peer_text("accuracy"),
                detail=f"Keras {100 * keras_acc:.2f}% vs int8_auto {100 * auto_row['eval']['accuracy']:.2f}% "
                f"(test n={auto_row['eval']['examples']}); agreement "
                f"{100 * auto_row['eval']['agreement']:.2f}%",
            ),
        ]
        if fam["qat"]:
            figures.append(
                figure(
                    f"{name}: QAT int8 accuracy loss vs the float model fine-tuned the same epoch",
                    qat_losses,
                    "pt",
                    target=TARGETS["qat_accuracy_loss_pt"],
                    peer=peer_text("qat") if qat_peer else None,
                    detail="per seed: "
                    + "; ".join(
                        f"control {100 * q['control_keras_accuracy']:.2f}% vs QAT .tflite "
                        f"{100 * q['qat_tflite_accuracy']:.2f}%"
                        for q in fam["qat"]
                    ),
                )
            )
        out_families[name] = {
            "run": fam["run"],
            "export_dir": fam["export_dir"],
            "model": fam["model"],
            "keras_test_accuracy": keras_acc,
            "plain_sizes": fam["plain_sizes"],
            "notes": fam["notes"],
            "models": rows,
            "qat": [{k: v for k, v in q.items() if k != "content"} for q in fam["qat"]],
        }
    return result(
        "B5",
        "TFLite post-training quantization",
        COMMAND,
        figures,
        benchmark="B5 TFLite PTQ",
        params=dataclasses.asdict(p),
        families=out_families,
        peers=peer_rows,
        targets=targets,
        latency_rounds=per,
    )


def report(res: dict) -> str:
    parts = []
    for name, fam in res["families"].items():
        rows = []
        for mode, r in fam["models"].items():
            lat = r["latency_interleaved"]
            rows.append(
                [
                    mode,
                    f"{r['size_bytes'] / 1024:.1f}",
                    f"{r['size_ratio_vs_float32']:.2f}x",
                    *[
                        f"{lat[k]['p50_ms'] * 1e3:.1f} ({lat[k]['speedup_vs_float32']:.2f}x)"
                        for k, _ in SETTINGS
                    ],
                    f"{100 * r['eval']['accuracy']:.2f}",
                    f"{-r['accuracy_loss_vs_keras_pt']:+.2f}",
                    f"{100 * r['eval']['agreement']:.2f}",
                ]
            )
        parts.append(
            f"## B5 TFLite PTQ: {name} ({fam['model']['params']:,} params), MNIST test, Keras accuracy "
            f"{100 * fam['keras_test_accuracy']:.2f}%; p50 at batch 1, median of "
            f"{res['params']['repeats']} interleaved rounds x {res['params']['runs']} runs; sizes stripped"
        )
        parts.append(
            markdown_table(
                [
                    "model",
                    "size KiB",
                    "smaller",
                    *[f"p50 {k} us (speedup)" for k, _ in SETTINGS],
                    "test acc %",
                    "Δ vs Keras pt",
                    "agreement %",
                ],
                rows,
            )
        )
        auto_info = fam["models"]["int8_auto"]["auto"]
        orows = [
            [
                t["op"],
                t["node"][:60],
                f"{1e3 * t['float_ms']:.1f}" if t["float_ms"] else "-",
                f"{1e3 * t['int8_ms']:.1f}" if t["int8_ms"] else "-",
                "float" if t["slower_in_int8"] else "int8",
            ]
            for t in auto_info["ops"]
        ]
        parts.append(
            f"### {name}: per-op timings (one-op models, 1 thread) and the int8_auto decision"
        )
        parts.append(markdown_table(["op", "node", "float32 us", "int8 us", "kept in"], orows))
    for r in res["peers"].values():
        parts.append(
            f"### Peer: {r['tutorial']}: float {r['float32']['size_bytes']:,} B, int8 "
            f"{r['int8']['size_bytes']:,} B ({r['int8_size_ratio']:.2f}x smaller); int8 1-thread speedup "
            f"{r['int8']['latency']['xnnpack/1t']['speedup_vs_float32']:.2f}x; accuracy Keras "
            f"{100 * r['keras_test_accuracy']:.2f}% -> int8 {100 * r['int8']['accuracy']:.2f}%"
        )
    parts.append(figures_table(res["figures"]))
    return "\n\n".join(parts)
