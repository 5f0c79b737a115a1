"""tfopt.optimize: tfmot pruning, quantization-aware training and clustering, alone or combined,
fine-tuned under any tf.distribute strategy and precision policy.

The names below are re-exported lazily (PEP 562): importing the package stays cheap, so
``python -m tfopt.optimize --help`` and parameter-server task servers do not load tfmot.
"""

import importlib

_EXPORTS = {
    "ClusterSpec": "tfopt.optimize.cluster",
    "check_clusters": "tfopt.optimize.cluster",
    "OptimizeError": "tfopt.errors",
    "Selection": "tfopt.optimize.common",
    "m_by_n_violations": "tfopt.optimize.common",
    "rebuild": "tfopt.optimize.common",
    "weight_table": "tfopt.optimize.common",
    "weights_gzip_bytes": "tfopt.optimize.common",
    "format_report": "tfopt.optimize.inspect",
    "inspect_model": "tfopt.optimize.inspect",
    "PruneSpec": "tfopt.optimize.prune",
    "check_blocks": "tfopt.optimize.prune",
    "check_m_by_n": "tfopt.optimize.prune",
    "QatSpec": "tfopt.optimize.quantize",
    "load_quantized_model": "tfopt.optimize.quantize",
    "quantize_scope": "tfopt.optimize.quantize",
    "register_quantize_config": "tfopt.optimize.quantize",
    "unregister_quantize_config": "tfopt.optimize.quantize",
    "OptimizeSettings": "tfopt.optimize.runner",
    "optimize": "tfopt.optimize.runner",
    "run": "tfopt.optimize.runner",
    "plain_copy": "tfopt.optimize.student",
    "strip_wrappers": "tfopt.optimize.common",
    "TECHNIQUES": "tfopt.optimize.techniques",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tfopt.optimize' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
