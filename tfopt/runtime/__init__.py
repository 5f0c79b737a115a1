"""tfopt.runtime: the Job every stage runs in (cluster, strategy, precision, data, the fit loop,
backups, the record), and the CPU set-up. Names load on first use (PEP 562)."""

from tfopt.core.lazy import exports

_EXPORTS = {
    "Job": "tfopt.runtime.job",
    "connect": "tfopt.runtime.job",
    "weights_digest": "tfopt.runtime.job",
    "STRATEGIES": "tfopt.core.specs",
    "make_strategy": "tfopt.runtime.strategy",
    "parse_tf_config": "tfopt.runtime.tf_config",
    "setup_cpu_replicas": "tfopt.runtime.devices",
    "Pipelined": "tfopt.runtime.gpipe",
    "partition": "tfopt.runtime.gpipe",
    "build_stages": "tfopt.runtime.gpipe",
    "stage_devices": "tfopt.runtime.gpipe",
    "measure_pipeline": "tfopt.runtime.gpipe.measure:measure",
    "median_seconds": "tfopt.runtime.gpipe.measure",
    "stage_peaks": "tfopt.runtime.gpipe.measure",
    "check_budget": "tfopt.runtime.gpipe.measure",
}

__all__, __getattr__ = exports(__name__, _EXPORTS)
