"""The tf.data input pipeline over prepared TFRecord shards.

``build`` follows the tf.data performance guide, in this order: seeded file-order shuffle
(training) -> sharding by input pipeline (whole files when there are at least as many files as
pipelines, else every n-th record of each file) -> parallel interleave of TFRecordDataset ->
parallel parse/decode -> cache -> record shuffle (training) -> batch -> vectorized augmentation
-> prefetch.

Training data is a stream of passes over the split, each a fresh order that is a pure function
of (``data.seed``, pass index, input pipeline): ``build(..., start_step=g)`` yields exactly the
batches an uninterrupted stream yields from its batch ``g`` on. That is how a resumed run sees
the data it would have seen (with ``data.deterministic``; otherwise parallel reads may reorder
records within a pass). Every pass has the same number of batches in every input pipeline, so
the workers of a multi-worker job stay in step:

- ``cache="memory"`` (default): parsed records are cached once; each pass is a full uniform
  permutation of them (a shuffle buffer holding every record, by reference). The first batch
  waits for the split to be read.
- ``cache="none"``: each pass reads the files in a new order and mixes records within
  ``data.shuffle_buffer``.
- ``cache="file"``: for data larger than memory. Each pass replays the cached order, mixed within
  ``data.shuffle_buffer`` records with that pass's seed.

Evaluation (``training=False``) reads deterministically, never shuffles nor drops a remainder, and
with several input pipelines still sees every record exactly once across them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence

from tfopt._keras import tf

import numpy as np

from tfopt import _compat
from tfopt.config import AUTOTUNE, DataConfig, feed_normalize
from tfopt.data import service
from tfopt.data.augment import (
    check_model_shape,
    crop_flip_augment,
    eval_transform,
    normalize_batches,
)
from tfopt.data.builtin import SPLITS
from tfopt.data.shards import scan_tfrecord
from tfopt.data.sources import DatasetInfo, dataset_dir, prepare
from tfopt.errors import ConfigError, DataError

SHIFT_PIXELS = 2
PARSE_BLOCK = 256  # records parsed per call of a vectorized parse function
_ENDLESS = 2**62  # passes in a training stream: never reached
_PASS_GRAPH_SEED = 0x5EED

Augment = Callable[[tf.Tensor, tf.Tensor], tuple]


def _tune(value: int) -> int:
    return tf.data.AUTOTUNE if value == AUTOTUNE else value


def parse_fn(info: DatasetInfo, split: str) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """Returns a function: serialized tfopt ``tf.train.Example`` -> (image, label).

    When the stored images share one shape, the function also accepts a vector of records and
    then returns batched tensors; ``build`` uses that (it is marked ``vectorized``) because
    parsing records in blocks is several times faster than one by one. Images of varying sizes
    (a ``folder:`` source) are parsed one by one and resized to ``info.image_shape``'s height and
    width on the way (bilinear), so that they can be batched.

    Args:
        info: The prepared dataset (image shapes and, per split, how images are encoded).
        split: The split whose records will be parsed.

    Returns:
        A function mapping one serialized record to ``(float32 [H, W, C] in [0, 1], int64 label)``
        (or a vector of them to ``([N, H, W, C], [N])``), at the stored size (see ``resize_fn``).

    Raises:
        DataError: ``split`` is not one of the dataset's splits.
    """
    stored = tuple(info.record_shape)
    varying = None in stored[:2]
    shape = (*info.image_shape[:2], stored[2]) if varying else stored
    encoding = _split(info, split).encoding
    image_key, label_key = info.feature_keys
    spec = {
        image_key: tf.io.FixedLenFeature([], tf.string),
        label_key: tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        if encoding == "png":
            image = tf.io.decode_png(encoded, channels=shape[2])
        elif encoding == "jpeg":
            image = tf.io.decode_jpeg(encoded, channels=shape[2])
        else:  # "image": JPEG, PNG, BMP or GIF (the first frame)
            image = tf.io.decode_image(encoded, channels=shape[2], expand_animations=False)
        if varying:
            image = tf.cast(
                tf.clip_by_value(tf.round(tf.image.resize(image, shape[:2])), 0, 255), tf.uint8
            )
        return tf.ensure_shape(image, shape)

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batched = serialized.shape.rank == 1
        example = (tf.io.parse_example if batched else tf.io.parse_single_example)(serialized, spec)
        if encoding == "raw":
            image = tf.reshape(
                tf.io.decode_raw(example[image_key], tf.uint8), ((-1,) if batched else ()) + shape
            )
        elif batched:
            image = tf.map_fn(
                decode, example[image_key], fn_output_signature=tf.TensorSpec(shape, tf.uint8)
            )
        else:
            image = decode(example[image_key])
        return tf.cast(image, tf.float32) * (1.0 / 255.0), example[label_key]

    parse.vectorized = not varying
    return parse


def resize_fn(info: DatasetInfo) -> Augment | None:
    """Returns ``(images, labels) -> (images, labels)`` on batches: the stored images to
    ``info.image_shape`` (``data.image_size``: bilinear resize, the aspect ratio not kept;
    ``data.channels``: gray repeated to RGB, or RGB to luma), or None when they already match."""
    stored, target = tuple(info.record_shape), tuple(info.image_shape)
    if None in stored[:2]:  # parse_fn resized them already
        stored = (*target[:2], stored[2])
    if stored == target:
        return None

    def resize(images, labels):
        if stored[2] != target[2]:
            images = (
                tf.image.grayscale_to_rgb(images)
                if target[2] == 3
                else tf.image.rgb_to_grayscale(images)
            )
        if stored[:2] != target[:2]:
            images = tf.image.resize(images, target[:2])
        return tf.ensure_shape(images, (None, *target)), labels

    return resize


def shift_augment(seed: int, start: int = 0) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """Returns a dataset transformation: random +-2 px translation of every batched image.

    The shifts of a batch depend only on ``seed`` and the batch's index in the stream (the first
    batch is number ``start``): a stream resumed at batch ``g`` shifts exactly as the uninterrupted
    one. Vacated pixels are filled with 0.
    """

    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        def shift(batch, index):
            images, labels = batch
            n = tf.shape(images)[0]
            offsets = tf.random.stateless_uniform(
                (n, 2),
                seed=tf.stack([tf.cast(seed, tf.int64), index]),
                minval=-SHIFT_PIXELS,
                maxval=SHIFT_PIXELS + 1,
                dtype=tf.int32,
            )
            dx, dy = tf.unstack(tf.cast(offsets, tf.float32), axis=1)
            one, zero = tf.ones_like(dx), tf.zeros_like(dx)
            # output(x, y) = input(x - dx, y - dy): a pure integer translation, no interpolation.
            transforms = tf.stack([one, zero, -dx, zero, one, -dy, zero, zero], axis=1)
            shifted = tf.raw_ops.ImageProjectiveTransformV3(
                images=images,
                transforms=transforms,
                output_shape=tf.shape(images)[1:3],
                fill_value=0.0,
                interpolation="NEAREST",
                fill_mode="CONSTANT",
            )
            return shifted, labels

        indices = tf.data.Dataset.range(start, _ENDLESS)
        return tf.data.Dataset.zip((ds, indices)).map(shift, num_parallel_calls=tf.data.AUTOTUNE)

    return apply


def pass_seed(seed, index):
    """The shuffle seed of pass ``index`` of a pipeline seeded ``seed`` (ints or int64 tensors)."""
    return tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(index, tf.int64)


def batches_per_pass(counts: Sequence[int], pipelines: int, by_file: bool, rows: int) -> int:
    """Batches of ``rows`` records every input pipeline yields per pass (the smallest shard's share).

    Args:
        counts: Records per file, in the (seeded) order the files are sharded in.
        pipelines: Input pipelines the files are split over.
        by_file: Whole files per pipeline (``files[i::pipelines]``), else every n-th record of each file.
        rows: Records per step of one pipeline (its batch size times the replicas it feeds).

    Raises:
        DataError: a pipeline's share of the split is smaller than one step.
    """
    if by_file:
        sizes = [sum(counts[i::pipelines]) for i in range(pipelines)]
    else:
        sizes = [sum(len(range(i, c, pipelines)) for c in counts) for i in range(pipelines)]
    n = min(sizes) // rows
    if n < 1:
        raise DataError(
            f"each of the {pipelines} input pipeline(s) gets {min(sizes)} training records, fewer "
            f"than one step of {rows}; lower data.global_batch_size or use more data"
        )
    return n


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


def _cache_key(
    files: Sequence[str], training: bool, pipelines: int, pipeline_id: int, seed: int
) -> str:
    text = "|".join([*files, str(training), str(pipelines), str(pipeline_id), str(seed)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build(
    files: Sequence[str],
    parse: Callable,
    cfg: DataConfig,
    *,
    training: bool,
    batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
    augment: Augment | None = None,
    cache_path: str | None = None,
    num_records: int | None = None,
    start_step: int = 0,
    service_job: str = "",
    resize: Augment | None = None,
) -> tf.data.Dataset:
    """Builds the input pipeline over TFRecord files.

    Args:
        files: TFRecord paths, in their canonical order.
        parse: Maps one serialized record to ``(image, label)`` (see ``parse_fn``); when it has
            a true ``vectorized`` attribute it is given blocks of records instead.
        cfg: Parallelism, buffers, cache mode, seed, determinism and augmentation settings.
        training: An endless stream of shuffled passes (see the module docstring), each without
            its last partial step, augmented; else one ordered pass over every record.
        batch_size: Batch size of this pipeline (per replica under a strategy).
        input_context: Shards the data across ``num_input_pipelines``: by file when there are at
            least as many files as pipelines, else by record within each file.
        augment: ``(images, labels) -> (images, labels)`` on batches; replaces ``cfg.augment``
            (``cfg.normalize`` still applies after it). Applied only when ``training``.
        cache_path: File prefix for ``cfg.cache == "file"``; default under ``cfg.data_dir``.
        num_records: How many records ``files`` hold (sizes the full shuffle of a memory-cached
            training pipeline); counted from the files when not given.
        start_step: Training only: the first batch of the stream to yield (a resumed run's step).
        service_job: Training with ``cfg.service``: the tf.data service job every trainer of the
            run shares. The service workers then produce one unsharded stream (the shared job
            splits it between the trainers, whole passes at a time under ``distributed_epoch``)
            and a resume starts at the pass of ``start_step``, not at the step itself.
        resize: ``(images, labels) -> (images, labels)`` on every batch, before any augmentation
            (see ``resize_fn``): the cache keeps the images as stored, which is smaller.

    Returns:
        A dataset of ``(images [B, H, W, C] float32, labels [B] int64)`` batches.

    Raises:
        DataError: ``files`` is empty, or a pipeline's share is smaller than one step.
        ConfigError: ``batch_size`` < 1.
    """
    files = [str(f) for f in files]
    if not files:
        raise DataError("no TFRecord files to read; prepare the dataset first (tfopt.data.prepare)")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1; give a positive batch size")
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    # The replicas this pipeline feeds take consecutive batches of it as one global step.
    group = max(1, input_context.num_replicas_in_sync // pipelines) if input_context else 1
    served = training and bool(cfg.service)
    if served:  # the same graph on every trainer: the shared service job does the splitting
        pipelines, pipeline_id = 1, 0
    seed = cfg.seed + pipeline_id  # different pipelines hold different data: decorrelate them
    if training:  # one seeded order, the same in every pipeline, so that file shards partition
        files = [files[i] for i in np.random.default_rng(cfg.seed).permutation(len(files))]
    by_file = pipelines > 1 and len(files) >= pipelines
    by_record = pipelines > 1 and not by_file
    ordered = None if training else True
    vectorized = getattr(parse, "vectorized", False)

    def read(path):
        records = tf.data.TFRecordDataset(path)
        # Sharding each file by record index makes the partition independent of read order.
        return records.shard(pipelines, pipeline_id) if by_record else records

    def records_of(file_ds: tf.data.Dataset, cache: bool) -> tf.data.Dataset:
        ds = file_ds.interleave(
            read,
            cycle_length=_tune(cfg.interleave_cycle_length),
            num_parallel_calls=_tune(cfg.num_parallel_reads),
            deterministic=ordered,
        )
        if vectorized:  # parse blocks of records
            ds = ds.batch(PARSE_BLOCK)
        ds = ds.map(parse, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=ordered)
        if cache and cfg.cache == "file":  # blocks: fewer, larger elements to write and read back
            ds = ds.cache(
                _pipeline_path(
                    _file_cache(cfg, files, training, pipelines, pipeline_id, cache_path),
                    pipeline_id,
                )
            )
        if vectorized:
            ds = ds.unbatch()
        # Single records, so that a shuffle can hold every one of them by reference.
        return ds.cache() if cache and cfg.cache == "memory" else ds

    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if by_file:
        file_ds = file_ds.shard(pipelines, pipeline_id)
    # Training drops the remainder at a global step's size, so that every epoch's steps hold the
    # same examples whatever the replica count (mirrored on 2 devices trains exactly like one device).
    if not training:
        ds = records_of(file_ds, cache=True).batch(batch_size)
        if resize is not None:
            ds = ds.map(
                resize, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=True
            )
        evaluate = eval_transform(cfg)  # crop_flip's central window, data.normalize
        if evaluate is not None:
            ds = ds.apply(evaluate)
    else:
        if pipelines == 1 and num_records is not None:
            counts = [num_records]
        else:
            counts = [scan_tfrecord(f) for f in files]
        per_pass = batches_per_pass(counts, pipelines, by_file, batch_size * group)
        # Sized to the records, not beyond: tf.data allocates the whole buffer up front.
        full = -(-sum(counts) // pipelines) if by_record else sum(counts)
        buffer = full if cfg.cache == "memory" else cfg.shuffle_buffer
        cached = records_of(file_ds, cache=True) if cfg.cache != "none" else None

        def one_pass(index):
            # A graph-level seed of this function's own: with a tensor op seed, TensorFlow's seed
            # logic fails when the global seed is 0, and the order must not depend on it anyway.
            tf.random.set_seed(_PASS_GRAPH_SEED)
            records = cached
            if records is None:  # re-read the files, in this pass's order
                records = records_of(
                    file_ds.shuffle(len(files), seed=pass_seed(seed, index)), cache=False
                )
            ds = records.shuffle(
                max(1, buffer), seed=pass_seed(seed, index), reshuffle_each_iteration=False
            )
            if group > 1:
                ds = ds.batch(batch_size * group, drop_remainder=True).rebatch(batch_size)
            else:
                ds = ds.batch(batch_size, drop_remainder=True)
            return ds.take(per_pass * group)

        first, skip = divmod(int(start_step), per_pass)
        ds = tf.data.Dataset.range(first, _ENDLESS).flat_map(one_pass)
        if not served:
            ds = ds.skip(skip * group)
        start = (
            int(start_step) - (skip if served else 0)
        ) * group  # stream index of the first batch
        if resize is not None:
            ds = ds.map(
                resize, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=ordered
            )
        if augment is not None:
            ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        elif cfg.augment == "shift":
            ds = ds.apply(shift_augment(seed, start=start))
        elif cfg.augment == "crop_flip":  # normalizes in the same pass
            ds = ds.apply(crop_flip_augment(cfg, seed, start=start))
        if feed_normalize(cfg) and (augment is not None or cfg.augment != "crop_flip"):
            ds = ds.apply(normalize_batches(cfg))
        if served:  # everything above runs on the service workers, with these options
            ds = service.maybe_distribute(
                ds.with_options(_options(cfg, training, sharded=False)),
                cfg,
                training=True,
                job_name=service_job,
            )
    ds = ds.prefetch(_tune(cfg.prefetch_buffer))
    return ds.with_options(_options(cfg, training, sharded=input_context is not None))


def _file_cache(
    cfg: DataConfig,
    files: Sequence[str],
    training: bool,
    pipelines: int,
    pipeline_id,
    cache_path: str | None,
) -> str:
    if cache_path is None:
        key = _cache_key(
            files,
            training,
            pipelines,
            pipeline_id if isinstance(pipeline_id, int) else -1,
            cfg.seed,
        )
        cache_path = os.path.join(
            cfg.data_dir, "tfcache", key + ("" if isinstance(pipeline_id, int) else "-p{id}")
        )
    os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
    return cache_path


def _split(info: DatasetInfo, split: str):
    if split not in info.splits:
        raise DataError(f"split {split!r} does not exist; choose one of {', '.join(info.splits)}")
    return info.splits[split]


def _pipeline_path(path: str, pipeline_id) -> str | tf.Tensor:
    """``path`` with ``{id}`` replaced by ``pipeline_id`` when that is a tensor (a worker index known
    only when the worker runs the dataset function, see ``per_worker_context``)."""
    if isinstance(pipeline_id, int) or "{id}" not in path:
        return path
    head, tail = path.split("{id}", 1)
    return tf.strings.join([head, tf.strings.as_string(pipeline_id), tail])


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


def per_pipeline_batch_size(
    cfg: DataConfig, input_context: tf.distribute.InputContext | None
) -> int:
    """Returns the batch size one input pipeline produces: per replica under a strategy."""
    if input_context is None:
        return cfg.global_batch_size
    try:
        return input_context.get_per_replica_batch_size(cfg.global_batch_size)
    except ValueError:
        n = input_context.num_replicas_in_sync
        raise ConfigError(
            f"data.global_batch_size={cfg.global_batch_size} is not divisible by the {n} "
            f"replicas; choose a multiple of {n}"
        ) from None


def make_dataset(
    cfg: DataConfig,
    split: str,
    *,
    training: bool,
    input_context: tf.distribute.InputContext | None = None,
    info: DatasetInfo | None = None,
    start_step: int = 0,
    service_job: str = "",
) -> tf.data.Dataset:
    """Prepares (if needed) and reads one split.

    Args:
        cfg: The data config.
        split: ``train``, ``validation`` or ``test``.
        training: Training mode (see ``build``).
        input_context: From ``tf.distribute``; batches are then per replica.
        info: An already prepared dataset; saves re-verifying the shards.
        start_step: Training only: the first step of the stream to yield (see ``build``).
        service_job: Training through the tf.data service: the run's shared job (see ``build``).

    Returns:
        A batched ``(images, labels)`` dataset: an endless stream of shuffled passes when
        ``training``, else one ordered pass over this pipeline's records.

    Raises:
        DataError: bad split name, or any ``prepare`` failure.
        ConfigError: the global batch size does not divide among the replicas.
    """
    if split not in SPLITS:
        raise DataError(f"split {split!r} does not exist; choose one of {', '.join(SPLITS)}")
    info = info or prepare(cfg)
    check_model_shape(cfg, info.image_shape)
    files = _split(info, split).files
    cache_path = None
    if cfg.cache == "file":
        n = input_context.num_input_pipelines if input_context else 1
        i = input_context.input_pipeline_id if input_context else 0
        mode = "train" if training else "eval"
        i = (
            i if isinstance(i, int) else "{id}"
        )  # a tensor under ParameterServerStrategy: see _pipeline_path
        cache_path = os.path.join(
            dataset_dir(cfg), "tfcache", f"{split}-{mode}-seed{cfg.seed}-p{i}of{n}"
        )
    return build(
        files,
        parse_fn(info, split),
        cfg,
        training=training,
        batch_size=per_pipeline_batch_size(cfg, input_context),
        input_context=input_context,
        cache_path=cache_path,
        num_records=_split(info, split).num_records,
        start_step=start_step,
        service_job=service_job,
        resize=resize_fn(info),
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
