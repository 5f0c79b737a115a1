"""The input under a tf.distribute strategy: one pipeline per worker (each parameter-server worker
its own), per-replica batches, and the dataset functions strategies call."""

from __future__ import annotations

from collections.abc import Callable

from tfopt.core._keras import tf

from tfopt.config import DataConfig
from tfopt.core import _compat
from tfopt.data.pipeline import make_dataset
from tfopt.data.sources import DatasetInfo, prepare


def per_worker_context(
    input_context: tf.distribute.InputContext | None,
) -> tf.distribute.InputContext | None:
    """Makes each ParameterServerStrategy worker its own input pipeline; other contexts pass unchanged.

    Under ``ParameterServerStrategy`` the dataset function is traced once, on the coordinator, with
    ``InputContext(num_input_pipelines=1, input_pipeline_id=0)``, and the same graph then runs on
    every worker. Left like that, every worker shuffles with the same seed and reads the same
    batches in the same order, so concurrent workers apply each batch twice. The returned context
    has one pipeline per worker whose id is the worker's index, a tensor resolved on each worker
    when it creates its dataset (``tf.distribute.coordinator.experimental_get_current_worker_index``):
    workers then read disjoint shards with different shuffle seeds.
    """
    if (
        input_context is None
        or input_context.num_input_pipelines != 1
        or not tf.distribute.has_strategy()
    ):
        return input_context
    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return input_context
    workers = _compat.parameter_server_workers(strategy)
    if workers < 2:
        return input_context
    return tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=tf.distribute.coordinator.experimental_get_current_worker_index(),
        num_replicas_in_sync=input_context.num_replicas_in_sync,
    )


def dataset_fn(
    cfg: DataConfig,
    split: str,
    *,
    training: bool,
    info: DatasetInfo | None = None,
    start_step: int = 0,
    service_job: str = "",
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """Returns ``fn(input_context) -> dataset`` for ``distribute_datasets_from_function`` and
    ``ParameterServerStrategy``'s DatasetCreator.

    The dataset is prepared (and verified) once, now; training streams are endless, as the
    coordinator needs (set ``steps_per_epoch``), begin at ``start_step`` and, with ``data.service``,
    come from the tf.data service job ``service_job``.
    """
    info = info or prepare(cfg)

    def fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_dataset(
            cfg,
            split,
            training=training,
            input_context=per_worker_context(input_context),
            info=info,
            start_step=start_step,
            service_job=service_job,
        )

    return fn


def distribute(
    strategy: tf.distribute.Strategy,
    cfg: DataConfig,
    split: str,
    *,
    training: bool,
    info: DatasetInfo | None = None,
):
    """Returns ``strategy.distribute_datasets_from_function`` over this split: one pipeline per worker.

    Args:
        strategy: Any tf.distribute strategy supporting ``distribute_datasets_from_function``.
        cfg: The data config; ``global_batch_size`` is split evenly among the replicas.
        split: ``train``, ``validation`` or ``test``.
        training: Training mode (see ``build``).
        info: An already prepared dataset.

    Returns:
        A ``tf.distribute.DistributedDataset`` of per-replica batches.
    """
    info = info or prepare(cfg)
    return strategy.distribute_datasets_from_function(
        lambda ctx: make_dataset(
            cfg, split, training=training, input_context=per_worker_context(ctx), info=info
        )
    )
