"""tfopt.export: .tflite conversion, LiteRT evaluation, fidelity gate and latency benchmark.

Names are re-exported lazily (PEP 562) so that ``python -m tfopt.export`` can reject a bad flag
before TensorFlow is imported.
"""

from tfopt.core.lazy import exports

_EXPORTS = {
    "tfopt.export.auto": ("AutoResult", "search"),
    "tfopt.export.benchmark": (
        "file_sizes",
        "keras_cost",
        "kernel_report",
        "latency",
        "litert_benchmark",
    ),
    "tfopt.export.choices": (
        "DEFAULT_MODES",
        "IO_TYPES",
        "KERNELS",
        "MODES",
        "parse_modes",
        "parse_threads",
    ),
    "tfopt.export.rounds": ("measurable",),
    "tfopt.export.evaluate": (
        "EvalResult",
        "TFLiteModel",
        "keras_outputs",
        "load_split",
        "read_tflite",
    ),
    "tfopt.export.fidelity": (
        "GateResult",
        "SelectiveResult",
        "Thresholds",
        "check",
        "rank_layers",
        "selective_search",
    ),
    "tfopt.export.runner": (
        "BenchSettings",
        "ExportSettings",
        "benchmark_file",
        "evaluate_file",
        "run",
    ),
    "tfopt.export.tflite": (
        "ConversionError",
        "ConvertOptions",
        "Converted",
        "calibration_batches",
        "convert",
        "is_qat_model",
        "make_converter",
        "strip_strings",
        "weight_sparsity",
    ),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}
# Published under another name: ``evaluate`` is also the module's name, which wins once imported.
_HOMES["measure_roofline"] = "tfopt.export.roofline:measure"
_HOMES["evaluate_tflite"] = "tfopt.export.evaluate:evaluate"
__all__, __getattr__ = exports(__name__, _HOMES)
