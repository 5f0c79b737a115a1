"""fashion_edge: the mnist_edge chain on Fashion-MNIST (nothing in tfopt is MNIST-specific).

Fashion-MNIST is harder than MNIST: the teacher trains longer, the student gets more epochs and
the edge model may lose more accuracy before it is rejected.

    python -m tfopt.pipeline pipelines/fashion_edge.py
    python -m tfopt.pipeline pipelines/fashion_edge.py --variant smoke
"""

from tfopt.pipeline import from_dict

VARIANTS = ("default", "smoke")

DEFAULT = {
    "name": "fashion_edge",
    "data": {
        "dataset": "fashion_mnist",
        "global_batch_size": 128,
        "cache": "memory",
        "augment": "none",
    },
    "runtime": {"strategy": "mirrored", "cpu_replicas": 2},
    "teacher": {"model": "cnn", "epochs": 6, "learning_rate": 1e-3},
    "student": {
        "model": "small_cnn",
        "epochs": 8,
        "learning_rate": 2e-3,
        "temperature": 4.0,
        "alpha": 0.9,
    },
    "compress": {"techniques": ["pqat"], "sparsity": 0.5, "epochs": 1, "learning_rate": 5e-4},
    "export": {
        "modes": ["float32", "dynamic_auto", "float16", "int8", "int16x8"],
        "runs": 200,
        "threads": [1, 2],
    },
    "select": "acc_drop<=1.5,min:p50_us",
}

SMOKE = {
    "data": {"limit": 1024, "global_batch_size": 64},
    # 16 steps per epoch: tracing dominates, and one device traces each step function once
    # (mirrored traces it once per replica). --strategy mirrored runs the smoke under mirrored.
    "runtime": {"strategy": "one_device"},
    "teacher": {"epochs": 1},
    "student": {"epochs": 2},
    "compress": {"epochs": 1},
    "export": {
        "modes": ["float32", "int8"],
        "eval_limit": 256,
        "runs": 20,
        "warmup": 3,
        "threads": [1],
        "calibration_steps": 4,
    },
    "probe": {"steps": 8},
    "select": "acc_drop<=100,min:p50_us",
}


def get_config(variant: str = "default"):
    """The pipeline's config for ``variant`` (``default`` or ``smoke``)."""
    cfg = from_dict(DEFAULT)
    return from_dict(SMOKE, cfg) if variant == "smoke" else cfg
