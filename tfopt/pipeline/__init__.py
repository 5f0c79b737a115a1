"""tfopt.pipeline: one command from data to a verified edge model and its report.

``run_pipeline(cfg, run_dir)`` is the library entry (:mod:`tfopt.pipeline.runner`);
``load_pipeline(path, variant)`` reads a pipeline file's ``get_config(variant)``. Names are
imported lazily so that the command line rejects a bad flag before TensorFlow starts.
"""

from tfopt.core.lazy import exports

_EXPORTS = {
    "PipelineConfig": "tfopt.pipeline.config",
    "TeacherSpec": "tfopt.pipeline.config",
    "StudentSpec": "tfopt.pipeline.config",
    "CompressSpec": "tfopt.pipeline.config",
    "ExportSpec": "tfopt.pipeline.config",
    "LaunchSpec": "tfopt.pipeline.config",
    "load_pipeline": "tfopt.pipeline.config",
    "find_pipeline": "tfopt.pipeline.config",
    "example_names": "tfopt.pipeline.config",
    "apply_overrides": "tfopt.pipeline.config",
    "from_dict": "tfopt.pipeline.config",
    "plan": "tfopt.pipeline.stages",
    "run_pipeline": "tfopt.pipeline.runner",
}
__all__, __getattr__ = exports(__name__, _EXPORTS)
