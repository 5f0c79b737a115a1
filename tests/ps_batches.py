"""Run under ``tfopt.launch --chief --workers 2 --ps 1``: which batches do parameter-server workers read?

The chief schedules closures that each take one batch from the per-worker training input that
``tfopt`` builds for ``fit`` and return a fingerprint per example. Workers that read the same
stream (the defect: one input pipeline traced on the chief, run identically on every worker)
return the same batches; workers with their own shards never do. Prints one JSON line.
"""

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfopt.core._keras import tf  # noqa: E402

from tfopt import config as C  # noqa: E402
from tfopt.data import distributed  # noqa: E402
from tfopt.runtime.job import Job  # noqa: E402


def main(closures: int) -> None:
    cfg = C.from_dict(
        {
            "data": {"dataset": "digits", "global_batch_size": 32, "num_shards": 4},
            "runtime": {"strategy": "parameter_server"},
        }
    )
    with Job(cfg, "train", out_dir=False) as job:  # workers and ps serve inside
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(job.strategy)
        fn = distributed.dataset_fn(cfg.data, "train", training=True, info=job.info)
        with job.strategy.scope():  # as Keras fit builds it under ParameterServerStrategy
            per_worker = coordinator.create_per_worker_dataset(
                lambda: job.strategy.distribute_datasets_from_function(fn)
            )
        iterator = iter(per_worker)

        # One number per example: a fixed random projection of its pixels, plus its label.
        projection = tf.constant(tf.random.stateless_uniform(job.info.image_shape, seed=[1, 2]))

        @tf.function
        def fingerprints(it):
            x, y = next(it)
            return tf.reduce_sum(x * projection, axis=[1, 2, 3]) * 100.0 + tf.cast(y, tf.float32)

        results = [coordinator.schedule(fingerprints, args=(iterator,)) for _ in range(closures)]
        coordinator.join()
        batches = [sorted(round(float(v), 4) for v in r.fetch()) for r in results]
        print(
            "ps_batches "
            + json.dumps(
                {"batches": batches, "train_records": job.info.splits["train"].num_records}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(int(sys.argv[1]))
