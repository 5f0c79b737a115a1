"""mnist_edge: MNIST to a verified edge model.

Teacher ``cnn`` trained under the chosen strategy -> student ``small_cnn`` distilled from it ->
the student compressed three ways (pruned to 50% with prune-preserving quantization-aware
training; channel-pruned and low-rank factorized to half its multiply-adds) -> every model
exported in every post-training quantization mode it takes -> each variant evaluated on the
test split and timed with LiteRT -> the report, with the edge model chosen by ``select``.

    python -m tfopt.pipeline pipelines/mnist_edge.py                    # the README's figures
    python -m tfopt.pipeline pipelines/mnist_edge.py --variant smoke    # the chain on a small slice
"""

from tfopt.pipeline import from_dict

VARIANTS = ("default", "smoke")

DEFAULT = {
    "name": "mnist_edge",
    "data": {"dataset": "mnist", "global_batch_size": 128, "cache": "memory"},
    "runtime": {"strategy": "mirrored", "cpu_replicas": 2},
    "teacher": {"model": "cnn", "epochs": 3, "learning_rate": 1e-3},
    "student": {
        "model": "small_cnn",
        "epochs": 5,
        "learning_rate": 2e-3,
        "temperature": 4.0,
        "alpha": 0.9,
    },
    "compress": {
        "techniques": ["pqat", "channel_prune", "low_rank"],
        "sparsity": 0.5,
        "flops": 0.5,
        "epochs": 1,
        "learning_rate": 5e-4,
    },
    "export": {
        "modes": ["float32", "dynamic_auto", "float16", "int8", "int16x8"],
        "runs": 200,
        "threads": [1, 2],
    },
    "select": "acc_drop<=0.5,min:p50_us",
}

# The whole chain on 1,024 training examples, one epoch per stage, quick measurements.
SMOKE = {
    "data": {"limit": 1024, "global_batch_size": 64},
    # 16 steps per epoch: tracing dominates, and one device traces each step function once
    # (mirrored traces it once per replica). --strategy mirrored runs the smoke under mirrored.
    "runtime": {"strategy": "one_device"},
    "teacher": {"epochs": 1},
    "student": {"epochs": 2},
    "compress": {
        "techniques": ["pqat"],
        "epochs": 1,
    },  # the structured candidates: tests/test_pipeline.py
    "probe": {"steps": 8},
    "export": {
        "modes": ["float32", "dynamic_auto", "int8"],
        "eval_limit": 256,
        "runs": 20,
        "warmup": 3,
        "threads": [1],
        "calibration_steps": 4,
    },
    "select": "acc_drop<=100,min:p50_us",
}


def get_config(variant: str = "default"):
    """The pipeline's config for ``variant`` (``default`` or ``smoke``)."""
    cfg = from_dict(DEFAULT)
    return from_dict(SMOKE, cfg) if variant == "smoke" else cfg
