"""The tf.data input pipeline over prepared TFRecord shards.

``build`` follows the tf.data performance guide, in this order: seeded file-order shuffle
(training) -> sharding by input pipeline (whole files when there are at least as many files as
pipelines, else every n-th record of each file) -> parallel interleave of TFRecordDataset ->
parallel parse/decode -> cache -> record shuffle (training) -> batch -> vectorized augmentation
-> prefetch.

Training data is reshuffled each epoch, seeded by ``data.seed``: two runs with the same seed (and
``data.deterministic``) see the same sequence of epoch orders. A cache replays the order of the
pass that filled it, so the file-order shuffle in front of it acts on the first epoch only; what
reorders the later epochs is the record shuffle behind it:

- ``cache="memory"`` (default): the cache holds single parsed records and the record shuffle
  buffer holds all of them (references to the cached tensors, not copies), so every epoch is a
  fresh uniform permutation of the whole split. The first batch waits for the split to be read.
- ``cache="none"``: files are reshuffled and re-read every epoch; records are mixed within
  ``data.shuffle_buffer``.
- ``cache="file"``: for data larger than memory. Later epochs replay the first epoch's file order,
  mixed only within ``data.shuffle_buffer`` records (a full shuffle would need it all in memory).

Evaluation (``training=False``) reads deterministically, never shuffles nor drops a remainder, and
with several input pipelines still sees every record exactly once across them.
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable, Sequence

import numpy as np

from tfopt._keras import tf
from tfopt.config import AUTOTUNE, DataConfig
from tfopt.data.shards import scan_tfrecord
from tfopt.data.sources import DatasetInfo, dataset_dir, prepare
from tfopt.errors import ConfigError, DataError

SPLITS = ("train", "validation", "test")
SHIFT_PIXELS = 2
PARSE_BLOCK = 256  # records parsed per call of a vectorized parse function

Augment = Callable[[tf.Tensor, tf.Tensor], tuple]


def _tune(value: int) -> int:
    return tf.data.AUTOTUNE if value == AUTOTUNE else value


def parse_fn(info: DatasetInfo, split: str) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """Returns a function: serialized tfopt ``tf.train.Example`` -> (image, label).

    The function also accepts a vector of records and then returns batched tensors; ``build``
    uses that (it is marked ``vectorized``) because parsing records in blocks is several times
    faster than one by one.

    Args:
        info: The prepared dataset (image shape and, per split, how images are encoded).
        split: The split whose records will be parsed.

    Returns:
        A function mapping one serialized record to ``(float32 [H, W, C] in [0, 1], int64 label)``
        (or a vector of them to ``([N, H, W, C], [N])``).

    Raises:
        DataError: ``split`` is not one of the dataset's splits.
    """
    shape = tuple(info.image_shape)
    encoding = _split(info, split).encoding
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        if encoding == "png":
            return tf.ensure_shape(tf.io.decode_png(encoded, channels=shape[2]), shape)
        return tf.ensure_shape(tf.io.decode_jpeg(encoded, channels=shape[2]), shape)

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batched = serialized.shape.rank == 1
        example = (tf.io.parse_example if batched else tf.io.parse_single_example)(serialized, spec)
        if encoding == "raw":
            image = tf.reshape(tf.io.decode_raw(example["image"], tf.uint8), ((-1,) if batched else ()) + shape)
        elif batched:
            image = tf.map_fn(decode, example["image"], fn_output_signature=tf.TensorSpec(shape, tf.uint8))
        else:
            image = decode(example["image"])
        return tf.cast(image, tf.float32) * (1.0 / 255.0), example["label"]

    parse.vectorized = True
    return parse


def shift_augment(seed: int) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """Returns a dataset transformation: random +-2 px translation of every batched image.

    Seeded: the same seed gives the same shifts for the same batches; each epoch draws new ones.
    Vacated pixels are filled with 0.
    """
    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)

        def shift(batch, batch_seed):
            images, labels = batch
            n = tf.shape(images)[0]
            offsets = tf.random.stateless_uniform((n, 2), seed=batch_seed, minval=-SHIFT_PIXELS,
                                                  maxval=SHIFT_PIXELS + 1, dtype=tf.int32)
            dx, dy = tf.unstack(tf.cast(offsets, tf.float32), axis=1)
            one, zero = tf.ones_like(dx), tf.zeros_like(dx)
            # output(x, y) = input(x - dx, y - dy): a pure integer translation, no interpolation.
            transforms = tf.stack([one, zero, -dx, zero, one, -dy, zero, zero], axis=1)
            shifted = tf.raw_ops.ImageProjectiveTransformV3(
                images=images, transforms=transforms, output_shape=tf.shape(images)[1:3],
                fill_value=0.0, interpolation="NEAREST", fill_mode="CONSTANT")
            return shifted, labels

        return tf.data.Dataset.zip((ds, seeds)).map(shift, num_parallel_calls=tf.data.AUTOTUNE)

    return apply


def _options(cfg: DataConfig, training: bool, sharded: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = bool(cfg.deterministic) or not training
    if cfg.ram_budget_mb > 0:
        options.autotune.ram_budget = int(cfg.ram_budget_mb) * 1024 * 1024
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.map_fusion = True
    options.experimental_optimization.parallel_batch = True
    if sharded:  # we shard ourselves; tf.distribute must not shard again
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def _cache_key(files: Sequence[str], training: bool, pipelines: int, pipeline_id: int, seed: int) -> str:
    text = "|".join([*files, str(training), str(pipelines), str(pipeline_id), str(seed)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build(files: Sequence[str], parse: Callable, cfg: DataConfig, *, training: bool, batch_size: int,
          input_context: tf.distribute.InputContext | None = None, augment: Augment | None = None,
          cache_path: str | None = None, num_records: int | None = None) -> tf.data.Dataset:
    """Builds the input pipeline over TFRecord files.

    Args:
        files: TFRecord paths, in their canonical order.
        parse: Maps one serialized record to ``(image, label)`` (see ``parse_fn``); when it has
            a true ``vectorized`` attribute it is given blocks of records instead.
        cfg: Parallelism, buffers, cache mode, seed, determinism and augmentation settings.
        training: Shuffle files and records, drop the last partial batch, augment.
        batch_size: Batch size of this pipeline (per replica under a strategy).
        input_context: Shards the data across ``num_input_pipelines``: by file when there are at
            least as many files as pipelines, else by record within each file.
        augment: ``(images, labels) -> (images, labels)`` on batches; replaces ``cfg.augment``.
            Applied only when ``training``.
        cache_path: File prefix for ``cfg.cache == "file"``; default under ``cfg.data_dir``.
        num_records: How many records ``files`` hold (sizes the full shuffle of a memory-cached
            training pipeline); counted from the files when not given.

    Returns:
        A dataset of ``(images [B, H, W, C] float32, labels [B] int64)`` batches.

    Raises:
        DataError: ``files`` is empty.
        ConfigError: ``batch_size`` < 1.
    """
    files = [str(f) for f in files]
    if not files:
        raise DataError("no TFRecord files to read; prepare the dataset first (tfopt.data.prepare)")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1; give a positive batch size")
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    seed = cfg.seed + pipeline_id  # different pipelines hold different data: decorrelate them
    if training:  # one seeded order, the same in every pipeline, so that file shards partition
        files = [files[i] for i in np.random.default_rng(cfg.seed).permutation(len(files))]
    by_file = pipelines > 1 and len(files) >= pipelines
    by_record = pipelines > 1 and not by_file
    ordered = None if training else True

    ds = tf.data.Dataset.from_tensor_slices(files)
    if by_file:
        ds = ds.shard(pipelines, pipeline_id)
    if training:  # a fresh file order on each pass over the files (a cache makes that the first only)
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)

    def read(path):
        records = tf.data.TFRecordDataset(path)
        # Sharding each file by record index makes the partition independent of read order.
        return records.shard(pipelines, pipeline_id) if by_record else records

    ds = ds.interleave(read, cycle_length=_tune(cfg.interleave_cycle_length),
                       num_parallel_calls=_tune(cfg.num_parallel_reads), deterministic=ordered)
    vectorized = getattr(parse, "vectorized", False)
    if vectorized:  # parse blocks of records
        ds = ds.batch(PARSE_BLOCK)
    ds = ds.map(parse, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=ordered)
    if cfg.cache == "file":
        if cache_path is None:
            key = _cache_key(files, training, pipelines, pipeline_id if isinstance(pipeline_id, int) else -1, cfg.seed)
            cache_path = os.path.join(cfg.data_dir, "tfcache", key + ("" if isinstance(pipeline_id, int) else "-p{id}"))
        os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
        # blocks: fewer, larger elements to write and read back
        ds = ds.cache(_pipeline_path(cache_path, pipeline_id))
    if vectorized:
        ds = ds.unbatch()
    buffer = cfg.shuffle_buffer
    if cfg.cache == "memory":
        # Single records, so that the shuffle below can hold every one of them by reference.
        ds = ds.cache()
        if training:  # a full shuffle, or later epochs would replay the first one's file order;
            # sized to the records, not beyond: tf.data allocates the whole buffer up front.
            buffer = num_records if num_records is not None else sum(map(scan_tfrecord, files))
    if training:
        ds = ds.shuffle(max(1, buffer), seed=seed, reshuffle_each_iteration=True)
    # The replicas this pipeline feeds take consecutive batches of it as one global step. Training
    # drops the remainder at that step's size, so that every epoch's steps hold the same examples
    # whatever the replica count (mirrored on 2 devices trains exactly like one device).
    group = max(1, input_context.num_replicas_in_sync // pipelines) if input_context else 1
    if training and group > 1:
        ds = ds.batch(batch_size * group, drop_remainder=True).rebatch(batch_size)
    else:
        ds = ds.batch(batch_size, drop_remainder=training)
    if training and augment is not None:
        ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
    elif training and cfg.augment == "shift":
        ds = ds.apply(shift_augment(seed))
    ds = ds.prefetch(_tune(cfg.prefetch_buffer))
    return ds.with_options(_options(cfg, training, sharded=input_context is not None))


def _split(info: DatasetInfo, split: str):
    if split not in info.splits:
        raise DataError(f"split {split!r} does not exist; choose one of {', '.join(info.splits)}")
    return info.splits[split]


def _pipeline_path(path: str, pipeline_id) -> "str | tf.Tensor":
    """``path`` with ``{id}`` replaced by ``pipeline_id`` when that is a tensor (a worker index known
    only when the worker runs the dataset function, see ``per_worker_context``)."""
    if isinstance(pipeline_id, int) or "{id}" not in path:
        return path
    head, tail = path.split("{id}", 1)
    return tf.strings.join([head, tf.strings.as_string(pipeline_id), tail])


def per_worker_context(input_context: tf.distribute.InputContext | None) -> tf.distribute.InputContext | None:
    """Makes each ParameterServerStrategy worker its own input pipeline; other contexts pass unchanged.

    Under ``ParameterServerStrategy`` the dataset function is traced once, on the coordinator, with
    ``InputContext(num_input_pipelines=1, input_pipeline_id=0)``, and the same graph then runs on
    every worker. Left like that, every worker shuffles with the same seed and reads the same
    batches in the same order, so concurrent workers apply each batch twice. The returned context
    has one pipeline per worker whose id is the worker's index, a tensor resolved on each worker
    when it creates its dataset (``tf.distribute.coordinator.experimental_get_current_worker_index``):
    workers then read disjoint shards with different shuffle seeds.
    """
    if input_context is None or input_context.num_input_pipelines != 1 or not tf.distribute.has_strategy():
        return input_context
    strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return input_context
    # ParameterServerStrategyV2 keeps its resolver on the strategy, where Strategy.cluster_resolver
    # (which reads strategy.extended) does not look: it returns None.
    resolver = strategy.cluster_resolver or getattr(strategy, "_cluster_resolver", None)
    workers = resolver.cluster_spec().num_tasks("worker") if resolver is not None else strategy.extended._num_workers
    if workers < 2:
        return input_context
    return tf.distribute.InputContext(
        num_input_pipelines=workers,
        input_pipeline_id=tf.distribute.coordinator.experimental_get_current_worker_index(),
        num_replicas_in_sync=input_context.num_replicas_in_sync)


def per_pipeline_batch_size(cfg: DataConfig, input_context: tf.distribute.InputContext | None) -> int:
    """Returns the batch size one input pipeline produces: per replica under a strategy."""
    if input_context is None:
        return cfg.global_batch_size
    try:
        return input_context.get_per_replica_batch_size(cfg.global_batch_size)
    except ValueError:
        n = input_context.num_replicas_in_sync
        raise ConfigError(f"data.global_batch_size={cfg.global_batch_size} is not divisible by the {n} "
                          f"replicas; choose a multiple of {n}") from None


def make_dataset(cfg: DataConfig, split: str, *, training: bool,
                 input_context: tf.distribute.InputContext | None = None,
                 info: DatasetInfo | None = None) -> tf.data.Dataset:
    """Prepares (if needed) and reads one split.

    Args:
        cfg: The data config.
        split: ``train``, ``validation`` or ``test``.
        training: Training mode (see ``build``).
        input_context: From ``tf.distribute``; batches are then per replica.
        info: An already prepared dataset; saves re-verifying the shards.

    Returns:
        A batched ``(images, labels)`` dataset, finite (one pass over this pipeline's records).

    Raises:
        DataError: bad split name, or any ``prepare`` failure.
        ConfigError: the global batch size does not divide among the replicas.
    """
    if split not in SPLITS:
        raise DataError(f"split {split!r} does not exist; choose one of {', '.join(SPLITS)}")
    info = info or prepare(cfg)
    files = _split(info, split).files
    cache_path = None
    if cfg.cache == "file":
        n = input_context.num_input_pipelines if input_context else 1
        i = input_context.input_pipeline_id if input_context else 0
        mode = "train" if training else "eval"
        i = i if isinstance(i, int) else "{id}"  # a tensor under ParameterServerStrategy: see _pipeline_path
        cache_path = os.path.join(dataset_dir(cfg), "tfcache", f"{split}-{mode}-seed{cfg.seed}-p{i}of{n}")
    return build(files, parse_fn(info, split), cfg, training=training,
                 batch_size=per_pipeline_batch_size(cfg, input_context), input_context=input_context,
                 cache_path=cache_path, num_records=_split(info, split).num_records)


def dataset_fn(cfg: DataConfig, split: str, *, training: bool,
               info: DatasetInfo | None = None) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """Returns ``fn(input_context) -> dataset`` for ``ParameterServerStrategy``'s DatasetCreator.

    The dataset is prepared (and verified) once, now; training datasets repeat forever, as the
    coordinator needs (set ``steps_per_epoch``).
    """
    info = info or prepare(cfg)

    def fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = make_dataset(cfg, split, training=training, input_context=per_worker_context(input_context), info=info)
        return ds.repeat() if training else ds

    return fn


def distribute(strategy: tf.distribute.Strategy, cfg: DataConfig, split: str, *, training: bool,
               info: DatasetInfo | None = None):
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
        lambda ctx: make_dataset(cfg, split, training=training, input_context=per_worker_context(ctx), info=info))
