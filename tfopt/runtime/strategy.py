"""The strategy factories: one string -> a ``tf.distribute.Strategy``, plus the PS task servers.

The names and what tfopt must know about each strategy live in :data:`tfopt.core.specs.STRATEGIES`,
whose entries point at the factories here:

* ``one_device``: ``OneDeviceStrategy`` on ``/gpu:0`` when a GPU exists, else ``/cpu:0``.
* ``mirrored``: ``MirroredStrategy`` over all local GPUs, with TensorFlow's default
  cross-device op for GPUs (NCCL all-reduce where NCCL works, else hierarchical copy /
  reduction to one device). Without GPUs the CPU is split into ``runtime.cpu_replicas``
  logical devices (see :func:`tfopt.runtime.devices.setup_cpu_replicas`) and the replicas are
  combined with ``ReductionToOneDevice``, the cross-device op that works on CPUs.
* ``multi_worker_mirrored``: ``MultiWorkerMirroredStrategy`` over the TF_CONFIG cluster, with
  ``CommunicationOptions(implementation=AUTO|RING|NCCL)`` from ``runtime.collective`` and
  ``bytes_per_pack`` from ``runtime.bytes_per_pack`` (0: all gradients in one pack).
  It must be created before any other TensorFlow op runs in the process (TensorFlow raises
  "Collective ops must be configured at program startup" otherwise) and it waits, without a
  timeout, until every peer has started: wrap it in
  :class:`tfopt.runtime.watchdog.StartupWatchdog`.
* ``parameter_server``: ``ParameterServerStrategy`` on the chief (the coordinator); the
  ``worker`` and ``ps`` tasks run :func:`run_server` instead of the training program. Large
  variables may be sharded over the ps tasks (``runtime.variable_partitioner``, see
  :mod:`tfopt.runtime.sharding`).
"""

from __future__ import annotations

import logging
import os
from typing import NoReturn

from tfopt.core._keras import tf

import numpy as np

from tfopt.config import RuntimeConfig
from tfopt.core.errors import ClusterError, ConfigError
from tfopt.core.specs import STRATEGIES
from tfopt.runtime import sharding
from tfopt.runtime.devices import setup_cpu_replicas
from tfopt.runtime.tf_config import ClusterInfo, parse_tf_config, validate_for_strategy

log = logging.getLogger(__name__)

_COLLECTIVES = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def _gpus() -> list:
    return tf.config.list_physical_devices("GPU")


def _resolver(cluster: ClusterInfo):
    """Returns a cluster resolver for ``cluster``'s training tasks.

    ``TFConfigClusterResolver`` is used when the process's TF_CONFIG is this very cluster and
    lists no evaluator (it also counts local GPUs correctly); otherwise an equivalent
    ``SimpleClusterResolver`` over ``cluster.training_cluster``: TensorFlow must not see the
    evaluator the Kubeflow operator lists in ``cluster`` (it runs no server, and a
    ParameterServerStrategy coordinator connects to every task it is given).
    """
    try:
        from_env = parse_tf_config(os.environ.get("TF_CONFIG"))
    except ClusterError:
        from_env = None
    if from_env == cluster and "evaluator" not in cluster.cluster:
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({role: list(a) for role, a in cluster.training_cluster.items()}),
        task_type=cluster.task_type,
        task_id=cluster.task_index,
        rpc_layer=cluster.rpc_layer,
        num_accelerators={"GPU": len(_gpus())},
    )


def one_device(runtime: RuntimeConfig, cluster: ClusterInfo | None, **_) -> tf.distribute.Strategy:
    return tf.distribute.OneDeviceStrategy("/gpu:0" if _gpus() else "/cpu:0")


def mirrored(runtime: RuntimeConfig, cluster: ClusterInfo | None, **_) -> tf.distribute.Strategy:
    gpus = _gpus()
    if gpus:
        # TensorFlow picks NCCL all-reduce across GPUs when it can.
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(len(gpus))])
    setup_cpu_replicas(runtime.cpu_replicas)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][: runtime.cpu_replicas]
    # NCCL needs GPUs; reducing on one device is the all-reduce that works between CPU devices.
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def pipeline(runtime: RuntimeConfig, cluster: ClusterInfo | None, **_) -> tf.distribute.Strategy:
    # One process, one replica: the stages' placement is the model's (tfopt.runtime.gpipe).
    gpus = _gpus()
    if len(gpus) < runtime.stages:
        setup_cpu_replicas(max(runtime.stages, runtime.cpu_replicas))
    elif runtime.device_memory_mib:  # each stage's GPU allocates at most the budget
        limit = [tf.config.LogicalDeviceConfiguration(memory_limit=runtime.device_memory_mib)]
        for gpu in gpus[: runtime.stages]:
            tf.config.set_logical_device_configuration(gpu, limit)
    return tf.distribute.get_strategy()


def multi_worker(
    runtime: RuntimeConfig, cluster: ClusterInfo | None, **_
) -> tf.distribute.Strategy:
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=runtime.bytes_per_pack, implementation=_COLLECTIVES[runtime.collective]
    )
    if runtime.collective == "nccl" and not _gpus():
        raise ConfigError(
            "runtime.collective='nccl' needs GPUs and none is visible; use auto or ring"
        )
    resolver = _resolver(cluster) if cluster is not None else None
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    except (RuntimeError, ValueError) as e:
        # RuntimeError: the eager context already runs; ValueError: collectives were already
        # configured differently (an earlier MultiWorkerMirroredStrategy in this process).
        if "program startup" in str(e) or "already configured" in str(e):
            raise ClusterError(
                "strategy 'multi_worker_mirrored' must be created once per process, before any other TensorFlow "
                "op runs; call make_strategy() first (before building data pipelines or models)"
            ) from None
        raise


def parameter_server(
    runtime: RuntimeConfig, cluster: ClusterInfo | None, **_
) -> tf.distribute.Strategy:
    assert cluster is not None  # validate_for_strategy guarantees it
    if cluster.task_type != "chief":
        raise ClusterError(
            f"TF_CONFIG task.type={cluster.task_type!r}: under strategy 'parameter_server' only the chief builds "
            "the strategy; worker and ps tasks must call tfopt.runtime.strategy.run_server(cluster)"
        )
    _set_inter_op_threads(cluster.num_workers + 1)
    return tf.distribute.ParameterServerStrategy(
        _resolver(cluster),
        variable_partitioner=sharding.partitioner(runtime, len(cluster.cluster.get("ps", ()))),
    )


def make_strategy(runtime: RuntimeConfig, cluster: ClusterInfo | None) -> tf.distribute.Strategy:
    """Builds the distribution strategy named by ``runtime.strategy``.

    Args:
        runtime: Strategy name, CPU replica count, collective implementation and (for
            ``parameter_server``) how variables are sharded over the ps tasks
            (:mod:`tfopt.runtime.sharding`).
        cluster: The parsed TF_CONFIG (see :func:`tfopt.runtime.tf_config.parse_tf_config`),
            or None for a single process.

    Returns:
        The strategy. Build models, optimizers and tfmot wrappers inside its ``scope()``.

    Raises:
        ConfigError: unknown strategy name (the message lists the valid ones) or an
            impossible setting (NCCL without GPUs, CPU replicas after device initialisation).
        ClusterError: the cluster does not fit the strategy, this task must run a server
            instead (``parameter_server`` worker/ps) or is the evaluator, or
            MultiWorkerMirroredStrategy came after other TensorFlow work.
    """
    spec = STRATEGIES.get(runtime.strategy)
    validate_for_strategy(cluster, spec.name)
    if cluster is not None and cluster.is_evaluator:
        raise ClusterError(
            f"TF_CONFIG task.type='evaluator' takes no part in the training (strategy {spec.name!r}); "
            "evaluate the chief's checkpoints beside it instead of calling make_strategy()"
        )
    return spec.build(runtime, cluster)


def _set_inter_op_threads(n: int) -> None:
    # A coordinator or server with fewer inter-op threads than workers + 1 deadlocks on a
    # small machine: every worker's pending RPC holds one thread.
    current = tf.config.threading.get_inter_op_parallelism_threads() or (
        os.cpu_count() or 1
    )  # 0 = one per core
    if current >= n:
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(n)
    except RuntimeError:  # context already initialised: keep what it has
        pass


def run_server(cluster: ClusterInfo) -> NoReturn:
    """Runs this ``worker`` or ``ps`` task's TensorFlow server forever (``parameter_server``).

    The server cannot be shut down from inside the process: the launcher (or Kubernetes)
    ends it by killing the process once the chief has finished.

    Args:
        cluster: The parsed TF_CONFIG of a ``worker`` or ``ps`` task.

    Raises:
        ClusterError: the task is not a worker or ps, or its port is taken.
    """
    validate_for_strategy(cluster, "parameter_server")
    if cluster.task_type not in ("worker", "ps"):
        raise ClusterError(
            f"TF_CONFIG task.type={cluster.task_type!r} cannot run a parameter-server task server; "
            "only 'worker' and 'ps' tasks do (the chief calls make_strategy)"
        )
    # Lets the coordinator see a worker failure as a retryable error rather than a hang.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = max(cluster.num_workers + 1, os.cpu_count() or 1)
    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec({role: list(a) for role, a in cluster.training_cluster.items()}),
            job_name=cluster.task_type,
            task_index=cluster.task_index,
            protocol=cluster.rpc_layer,
            config=config,
            start=True,
        )
    except tf.errors.UnknownError as e:
        raise ClusterError(
            f"cannot start the {cluster.task_type}:{cluster.task_index} server on "
            f"{cluster.address!r} ({str(e).splitlines()[0]}); free the port or fix TF_CONFIG"
        ) from None
    log.info(f"{cluster.task_type}:{cluster.task_index} server listening on {cluster.address}")
    server.join()
    raise SystemExit(0)  # join() never returns; satisfies NoReturn


def is_chief(cluster: ClusterInfo | None) -> bool:
    """True when this process writes shared artifacts: a single process, or the chief task."""
    return cluster is None or cluster.is_chief


def num_replicas(strategy: tf.distribute.Strategy) -> int:
    """The number of replicas that each step's global batch is split over."""
    return int(strategy.num_replicas_in_sync)


def from_chief(strategy: tf.distribute.Strategy, chief: bool, size: int, compute) -> np.ndarray:
    """``compute()`` (``size`` floats) run by the chief only; every worker gets the chief's values.

    Under MultiWorkerMirroredStrategy the other workers wait in one all-reduce (a sum to which only
    the chief's replicas contribute), so a measurement made once, on a quiet machine, decides for
    all. Under any other strategy one process runs the job and ``compute()`` runs there.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return np.asarray(compute(), dtype=np.float64)
    local = len(strategy.extended.worker_devices)
    values = np.asarray(compute(), dtype=np.float64) / local if chief else np.zeros(size)
    if values.shape != (size,):
        raise ValueError(
            f"the chief's values have shape {values.shape}, the workers expect ({size},)"
        )
    mine = tf.constant(values, tf.float64)

    @tf.function
    def agree():
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, mine)
        )

    return strategy.experimental_local_results(agree())[0].numpy()
