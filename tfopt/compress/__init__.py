"""tfopt.compress: the compression techniques every stage may apply to a model.

Pruning, clustering and quantization-aware training (tfmot wrappers), channel pruning and low-rank
factorization (model surgery), the per-layer weight statistics, and :mod:`~tfopt.compress.student`,
which compresses a model another stage trains. The ``optimize`` stage fine-tunes with them; the
``distill`` stage compresses its student with them; ``export`` strips their wrappers. They import
no stage. Names load on first use (PEP 562).
"""

from tfopt.core.lazy import exports

_EXPORTS = {
    "ChannelSpec": "tfopt.compress.channel_prune",
    "LowRankSpec": "tfopt.compress.low_rank",
    "QatSpec": "tfopt.compress.quantize",
    "model_macs": "tfopt.compress.flops",
    "layer_macs": "tfopt.compress.flops",
    "model_us": "tfopt.compress.latency",
    "quantize_model": "tfopt.compress.quantize:wrap",
}

__all__, __getattr__ = exports(__name__, _EXPORTS)
