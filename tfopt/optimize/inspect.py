"""What each layer of a model supports: prunable / quantizable / clusterable / factorizable, or why not.

Each row also gives the layer's multiply-adds per example, for low-rank factorization the largest
rank that still saves (``yes: rank <= R of F``, F the full rank), and whether channel pruning may
remove its output channels (or which layer keeps them whole).

    python -m tfopt.optimize --from runs/mnist --inspect

A subclassed model or a Keras 3 model gets one sentence (what it is, why tfmot cannot rewrite it,
what to do), never a traceback.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tfopt.core._keras import keras

from tfopt.compress import cluster as cluster_lib
from tfopt.compress import low_rank as low_rank_lib
from tfopt.compress import prune as prune_lib
from tfopt.compress import quantize as quantize_lib
from tfopt.compress.channels import trace
from tfopt.compress.common import check_model
from tfopt.compress.flops import model_macs
from tfopt.compress.surgery import fresh
from tfopt.core.errors import TfoptError


@dataclass
class LayerSupport:
    """One layer's support by each technique: ``yes``, ``no weights`` or ``no: <reason and fix>``."""

    layer: str
    type: str
    params: int
    prune: str
    quantize: str
    cluster: str
    macs: int = 0
    low_rank: str = "-"
    channels: str = "-"


@dataclass
class Report:
    """The inspection of a model: per-layer rows, or one sentence when the model cannot be inspected."""

    model: str
    layers: list[LayerSupport]
    problem: str = ""

    def to_dict(self) -> dict:
        """JSON-ready data."""
        return {
            "model": self.model,
            "problem": self.problem,
            "layers": [asdict(r) for r in self.layers],
        }


def _verdict(reason: str | None, has_weights: bool) -> str:
    if reason:
        return "no: " + reason
    return "yes" if has_weights else "no weights"


def inspect_model(model) -> Report:
    """Inspects ``model`` layer by layer.

    Args:
        model: Any object; tf_keras functional and Sequential models get per-layer rows.

    Returns:
        A Report. For a subclassed model, a Keras 3 model or a non-model, ``problem`` holds one
        sentence and ``layers`` is empty.
    """
    name = getattr(model, "name", type(model).__name__)
    try:
        check_model(model)
    except TfoptError as e:
        return Report(model=str(name), layers=[], problem=str(e))
    rows = []
    own = fresh(model)  # its layers' calls are this model's alone
    macs = model_macs(own)
    cands, skipped = low_rank_lib.candidates(own, low_rank_lib.LowRankSpec())
    low_rank = {c.name: f"yes: rank <= {c.max_rank} of {min(c.matrix.shape)}" for c in cands}
    low_rank.update({name: f"no: {why}" for name, why in skipped.items()})
    ch = trace(own)
    channels = {}
    for producer in ch.producers:
        pins = ch.kept_whole(producer)
        channels[producer] = (
            (
                "no: kept whole, its channels reach "
                + "; ".join(f"{p} ({ch.why.get(p, 'model input')})" for p in pins)
            )
            if pins
            else "yes"
        )
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        prune_reason = prune_lib.why_not_prunable(layer) if layer.weights else None
        cluster_reason = cluster_lib.why_not_clusterable(layer) if layer.trainable_weights else None
        prunable = prune_reason is None and prune_lib._has_prunable_weights(layer)
        clusterable = cluster_reason is None and cluster_lib._has_weights(layer)
        rows.append(
            LayerSupport(
                layer=layer.name,
                type=type(layer).__name__,
                params=int(layer.count_params()),
                prune=_verdict(prune_reason, prunable),
                # Layers without weights still get their activations quantized.
                quantize=_verdict(quantize_lib.why_not_quantizable(layer), True),
                cluster=_verdict(cluster_reason, clusterable),
                macs=macs.get(layer.name, 0),
                low_rank=low_rank.get(layer.name, "-"),
                channels=channels.get(layer.name, "-"),
            )
        )
    return Report(model=str(name), layers=rows)


def format_report(report: Report) -> str:
    """Text for the terminal: a table, then the reasons and fixes for every ``no``."""
    if report.problem:
        return report.problem
    header = (
        "layer",
        "type",
        "params",
        "macs",
        "prune",
        "quantize",
        "cluster",
        "low_rank",
        "channels",
    )
    short = [
        (
            r.layer,
            r.type,
            str(r.params),
            str(r.macs),
            *(v if not v.startswith("no: ") else "NO" for v in (r.prune, r.quantize, r.cluster)),
            r.low_rank.replace("yes: rank ", "r ").replace(" of ", "/")
            if not r.low_rank.startswith("no: ")
            else "NO",
            "NO" if r.channels.startswith("no: ") else r.channels,
        )
        for r in report.layers
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *short)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [
        f"model {report.model!r}: what each technique can do with each layer (macs: multiply-adds per "
        "example; low_rank: the largest rank that saves, of the full rank)",
        fmt.format(*header),
    ]
    lines += [fmt.format(*row) for row in short]
    notes = [
        f"  {r.layer} ({kind}): {v[4:]}"
        for r in report.layers
        for kind, v in (
            ("prune", r.prune),
            ("quantize", r.quantize),
            ("cluster", r.cluster),
            ("low_rank", r.low_rank),
            ("channels", r.channels),
        )
        if v.startswith("no: ")
    ]
    if notes:
        lines += ["", "why not, and the fix:"] + notes
    return "\n".join(lines)
