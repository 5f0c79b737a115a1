"""TensorBoard HParams summaries: one run per variant, to compare them in the HParams dashboard.

    tensorboard --logdir <run>/report/hparams

Each variant is a run (``teacher/keras``, ``student-pqat/int8``, ...) with its hyperparameters
(model, architecture, format, technique) and its figures as metrics at step 0 (accuracy, delta,
agreement, sizes, latencies, chosen). The experiment config at the top level declares them, so
the dashboard's table and parallel-coordinates views show every variant side by side.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tfopt.report.collect import Variant

# metric tag -> (display name, description, how to read it)
METRICS = {
    "accuracy": ("accuracy (%)", "test accuracy", lambda v: v.accuracy_pct),
    "delta_pt": ("delta (pt)", "accuracy minus the teacher's Keras model's", lambda v: v.delta_pt),
    "agreement": (
        "agreement (%)",
        "top-1 agreement with its own Keras model",
        lambda v: v.agreement_pct,
    ),
    "size_kb": (
        "size (KiB)",
        ".tflite bytes, or float weight bytes for Keras",
        lambda v: None if v.size_bytes is None else v.size_bytes / 1024,
    ),
    "gzip_kb": (
        "gzip (KiB)",
        "gzip -9 of the .tflite",
        lambda v: None if v.gzip_bytes is None else v.gzip_bytes / 1024,
    ),
    "p50_us": ("p50 1t (us)", "batch-1 p50 latency, 1 thread", lambda v: v.p50_us),
    "p95_us": ("p95 1t (us)", "batch-1 p95 latency, 1 thread", lambda v: v.p95_us),
    "p50_us_2t": ("p50 2t (us)", "batch-1 p50 latency, 2 threads", lambda v: v.p50_us_2t),
}


def write(root: str, variants: Sequence[Variant], chosen: str | None) -> list[str]:
    """Writes the HParams experiment under ``root`` and one run per variant (``root/<model>/<format>``).

    Args:
        root: The HParams log directory (created).
        variants: Every variant.
        chosen: The chosen variant's name (its ``chosen`` metric is 1), or None.

    Returns:
        The run names written (the variants' names).
    """
    from tfopt.core._keras import tf

    from tensorboard.plugins.hparams import api as hp

    if not variants:
        return []
    params = {
        "model": hp.HParam(
            "model", hp.Discrete(sorted({v.model for v in variants})), display_name="model (stage)"
        ),
        "arch": hp.HParam(
            "arch",
            hp.Discrete(sorted({v.arch or "?" for v in variants})),
            display_name="architecture",
        ),
        "format": hp.HParam(
            "format",
            hp.Discrete(sorted({v.format for v in variants})),
            display_name="format / mode",
        ),
        "technique": hp.HParam(
            "technique", hp.Discrete(sorted({v.technique or "?" for v in variants}))
        ),
    }
    metrics = [
        hp.Metric(tag, display_name=name, description=desc)
        for tag, (name, desc, _) in METRICS.items()
    ]
    metrics.append(
        hp.Metric("chosen", display_name="chosen", description="1 for the variant the rule chose")
    )
    os.makedirs(root, exist_ok=True)
    writer = tf.summary.create_file_writer(root)
    with writer.as_default():
        hp.hparams_config(hparams=list(params.values()), metrics=metrics)
    writer.close()
    names = []
    for v in variants:
        writer = tf.summary.create_file_writer(os.path.join(root, v.model, v.format))
        with writer.as_default():
            hp.hparams(
                {
                    params["model"]: v.model,
                    params["arch"]: v.arch or "?",
                    params["format"]: v.format,
                    params["technique"]: v.technique or "?",
                },
                trial_id=v.name,
            )
            for tag, (_, _, read) in METRICS.items():
                value = read(v)
                if value is not None:
                    tf.summary.scalar(tag, float(value), step=0)
            tf.summary.scalar("chosen", 1.0 if v.name == chosen else 0.0, step=0)
        writer.close()
        names.append(v.name)
    return names
