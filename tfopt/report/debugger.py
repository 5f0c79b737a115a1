"""The quantization debugger's findings, read from export rows where the int8 fidelity gate fired.

When full-integer int8 fails the gate, the export stage ranks quantized tensors by their error in
quantization steps (RMSE / scale; about 0.29 for a well-behaved layer) and retries with the worst
ones left in float (``int8-selective``). This module turns those rows into the report's tables.
"""

from __future__ import annotations

from tfopt.report.collect import PipelineRun

HEALTHY_RMSE_OVER_SCALE = 0.29  # uniform rounding error of one step: 1 / sqrt(12)


def layer_of(tensor_name: str) -> str:
    """The Keras layer a debugger tensor belongs to (``model/conv0/Conv2D;...`` -> ``conv0``)."""
    for part in tensor_name.split(";"):
        segments = part.split("/")
        if len(segments) >= 3:
            return segments[1]
    first = tensor_name.split(";")[0]
    # The last layer's output tensor is named after the serving signature's call, not the layer.
    return f"model output ({first})" if first.startswith("StatefulPartitionedCall") else first


def findings(run: PipelineRun, top: int = 12) -> list[dict]:
    """One entry per export row that holds a selective-quantization search.

    Args:
        run: The collected pipeline run.
        top: How many of the worst layers to keep in ``worst`` (``ranking`` keeps them all).

    Returns:
        ``[{"model", "mode", "int8_gate", "test_gate", "passed", "float_layers", "trials", "ranking",
        "worst", ...}]``: ``int8_gate`` is the plain int8 row's gate (why it fired), ``passed`` whether
        the search passed on its split, ``test_gate`` the chosen model's gate on the test split,
        ``trials`` one row per attempt
        (layers kept in float, size, accuracy, agreement, gate), ``worst`` the ``top`` worst
        tensors with their layer and whether the chosen trial kept them in float.
    """
    out = []
    for stage in run.stages:
        if stage.kind != "export" or stage.record is None:
            continue
        rows = stage.record.section.get("modes") or []
        plain = next((r for r in rows if r.get("mode") == "int8"), None)
        model = stage.inputs[0] if stage.inputs else stage.name
        for row in rows:
            sel = row.get("selective")
            if not sel:
                continue
            trials = sel.get("trials") or []
            chosen = sel.get("chosen")
            floated = (
                set(trials[chosen]["float_layers"]) if trials and chosen is not None else set()
            )
            ranking = sel.get("ranking") or []
            worst = [
                {
                    "layer": layer_of(r["tensor_name"]),
                    "op": r.get("op_name"),
                    "rmse_over_scale": r.get("rmse_over_scale"),
                    "mse": r.get("mean_squared_error"),
                    "scale": r.get("scale"),
                    "in_float": r["tensor_name"] in floated,
                    "tensor": r["tensor_name"],
                }
                for r in ranking[:top]
            ]
            ev = row.get("eval") or {}
            out.append(
                {
                    "model": model,
                    "mode": row["mode"],
                    "int8_gate": (plain or {}).get("gate"),
                    "test_gate": row.get("gate"),
                    "test_accuracy": ev.get("accuracy"),
                    "test_agreement": ev.get("agreement"),
                    "test_examples": ev.get("examples"),
                    "passed": sel.get("passed"),
                    "chosen_trial": chosen,
                    "float_layers": sorted({layer_of(t) for t in floated}),
                    "search_split": sel.get("search_split"),
                    "search_examples": sel.get("search_examples"),
                    "trials": [
                        {
                            "float_layers": [layer_of(t) for t in tr.get("float_layers", [])],
                            "size_bytes": tr.get("size_bytes"),
                            "accuracy": (tr.get("result") or {}).get("accuracy"),
                            "agreement": (tr.get("result") or {}).get("agreement"),
                            "gate": tr.get("gate"),
                        }
                        for tr in trials
                    ],
                    "ranking": ranking,
                    "worst": worst,
                    "ranked_tensors": len(ranking),
                }
            )
    return out
