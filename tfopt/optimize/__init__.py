"""tfopt.optimize: tfmot pruning, quantization-aware training and clustering, alone or combined,
fine-tuned under any tf.distribute strategy and precision policy.

The names below are re-exported lazily (PEP 562): importing the package stays cheap, so
``python -m tfopt.optimize --help`` and parameter-server task servers do not load tfmot.
"""

from tfopt.core.lazy import exports

_EXPORTS = {
    "ClusterSpec": "tfopt.compress.cluster",
    "check_clusters": "tfopt.compress.cluster",
    "OptimizeError": "tfopt.core.errors",
    "Selection": "tfopt.compress.common",
    "m_by_n_violations": "tfopt.compress.common",
    "rebuild": "tfopt.compress.common",
    "weight_table": "tfopt.compress.common",
    "weights_gzip_bytes": "tfopt.compress.common",
    "total_sparsity": "tfopt.compress.common",
    "format_report": "tfopt.optimize.inspect",
    "inspect_model": "tfopt.optimize.inspect",
    "PruneSpec": "tfopt.compress.prune",
    "check_blocks": "tfopt.compress.prune",
    "check_m_by_n": "tfopt.compress.prune",
    "QatSpec": "tfopt.compress.quantize",
    "load_quantized_model": "tfopt.compress.quantize",
    "quantize_scope": "tfopt.compress.quantize",
    "register_quantize_config": "tfopt.compress.quantize",
    "unregister_quantize_config": "tfopt.compress.quantize",
    "OptimizeSettings": "tfopt.optimize.runner",
    "fine_tunes_of": "tfopt.optimize.runner",
    "resolved": "tfopt.optimize.runner",
    "Context": "tfopt.optimize.phases",
    "run_chain": "tfopt.optimize.phases",
    "settings_for": "tfopt.optimize.settings",
    "optimize": "tfopt.optimize.runner",
    "run": "tfopt.optimize.runner",
    "plain_copy": "tfopt.compress.student",
    "strip_wrappers": "tfopt.compress.common",
    "TECHNIQUES": "tfopt.compress.techniques",
}

__all__, __getattr__ = exports(__name__, _EXPORTS)
