"""Helper program for the multi-process tests: one cluster task, driven by TF_CONFIG.

    python tests/dist_worker.py STRATEGY [STARTUP_TIMEOUT]

``multi_worker_mirrored``: builds the strategy (under the start-up watchdog), does one
all-reduce and a 2-step tf_keras fit, then prints ``RESULT <task> replicas=<n> sum=<s>``.
``parameter_server``: worker/ps tasks run a server forever; the chief schedules closures with
a ClusterCoordinator and runs a 2-step tf_keras fit from a DatasetCreator, then prints
``RESULT chief ...``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfopt.config import RuntimeConfig  # noqa: E402
from tfopt.core import log  # noqa: E402
from tfopt.runtime.strategy import make_strategy, num_replicas, run_server  # noqa: E402
from tfopt.runtime.tf_config import cluster_from_env  # noqa: E402
from tfopt.runtime.watchdog import StartupWatchdog  # noqa: E402


def _model(keras):
    model = keras.Sequential([keras.layers.Dense(2, input_shape=(3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=1)
    return model


def main(strategy_name: str, startup_timeout: float) -> None:
    log.configure("tfopt")  # as a command line does: the server says where it listens
    cluster = cluster_from_env()
    runtime = RuntimeConfig(strategy=strategy_name, startup_timeout=startup_timeout)
    if strategy_name == "parameter_server" and cluster.task_type in ("worker", "ps"):
        run_server(cluster)
    peers = cluster.peers(("chief", "worker", "ps")) if cluster else []
    with StartupWatchdog(runtime.startup_timeout, peers):
        strategy = make_strategy(runtime, cluster)  # first TF work of the process (MWMS needs it)
    from tfopt.core._keras import keras, tf

    task = f"{cluster.task_type}:{cluster.task_index}"
    if strategy_name == "multi_worker_mirrored":
        total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        with strategy.scope():
            model = _model(keras)
        data = tf.data.Dataset.from_tensor_slices((tf.ones((16, 3)), tf.ones((16, 1)))).batch(4)
        model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
        print(f"RESULT {task} replicas={num_replicas(strategy)} sum={float(total):g}", flush=True)
        return
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0.0)
        model = _model(keras)

    @tf.function
    def bump():
        counter.assign_add(1.0)
        return counter.read_value()

    for _ in range(4):
        coordinator.schedule(bump)
    coordinator.join()

    def dataset_fn(input_context):
        return (
            tf.data.Dataset.from_tensor_slices((tf.ones((16, 3)), tf.ones((16, 1))))
            .repeat()
            .batch(4)
        )

    model.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=2, verbose=0
    )
    print(f"RESULT {task} counter={float(counter.numpy()):g}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
