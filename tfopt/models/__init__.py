"""tfopt.models: the model registry, the Distiller, and safe loading and saving. Names load on
first use (PEP 562)."""

from tfopt.core.lazy import exports

_EXPORTS = {
    "Distiller": "tfopt.models.distiller",
    "accuracy_weights": "tfopt.models.distiller",
    "teacher_log_probs": "tfopt.models.distiller",
    "build_model": "tfopt.models.registry",
    "load_model": "tfopt.models.io",
    "save_model": "tfopt.models.io",
}

__all__, __getattr__ = exports(__name__, _EXPORTS)
