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

import dataclasses
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from tfopt.core._keras import tf

import numpy as np

from tfopt.config import AUTOTUNE, DataConfig, feed_normalize
from tfopt.core.errors import ConfigError, DataError
from tfopt.data import service
from tfopt.data.augment import (
    check_model_shape,
    crop_flip_augment,
    eval_transform,
    normalize_batches,
)
from tfopt.data.builtin import SPLITS
from tfopt.data.parse import Augment, parse_fn, resize_fn, split_of
from tfopt.data.shards import scan_tfrecord
from tfopt.data.sources import DatasetInfo, dataset_dir, prepare

SHIFT_PIXELS = 2
PARSE_BLOCK = 256  # records parsed per call of a vectorized parse function
_ENDLESS = 2**62  # passes in a training stream: never reached
_PASS_GRAPH_SEED = 0x5EED


def _tune(value: int) -> int:
    return tf.data.AUTOTUNE if value == AUTOTUNE else value


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
    if training:  # one seeded order, the same in every pipeline, so that file shards partition
        files = [files[i] for i in np.random.default_rng(cfg.seed).permutation(len(files))]
    reader = _Reader(cfg, files, parse, training, pipelines, pipeline_id, cache_path)
    if not training:
        ds = _evaluation_pass(reader, batch_size, resize)
    else:
        ds = _training_stream(
            reader, batch_size, group, num_records, start_step, served, service_job, augment, resize
        )
    ds = ds.prefetch(_tune(cfg.prefetch_buffer))
    return ds.with_options(_options(cfg, training, sharded=input_context is not None))


@dataclasses.dataclass
class _Reader:
    """How one pipeline reads its records: its share of the files (or of each file's records),
    parsed, optionally cached; ``seed`` decorrelates pipelines that hold different data."""

    cfg: DataConfig
    files: list[str]
    parse: Callable
    training: bool
    pipelines: int
    pipeline_id: Any
    cache_path: str | None

    def __post_init__(self):
        self.seed = self.cfg.seed + self.pipeline_id
        self.by_file = self.pipelines > 1 and len(self.files) >= self.pipelines
        self.by_record = self.pipelines > 1 and not self.by_file
        self.ordered = None if self.training else True
        self.vectorized = getattr(self.parse, "vectorized", False)

    def file_dataset(self) -> tf.data.Dataset:
        """The files this pipeline reads (all of them when it shards by record)."""
        ds = tf.data.Dataset.from_tensor_slices(self.files)
        return ds.shard(self.pipelines, self.pipeline_id) if self.by_file else ds

    def _read(self, path):
        records = tf.data.TFRecordDataset(path)
        # Sharding each file by record index makes the partition independent of read order.
        return records.shard(self.pipelines, self.pipeline_id) if self.by_record else records

    def records_of(self, file_ds: tf.data.Dataset, cache: bool) -> tf.data.Dataset:
        """Parsed single records of ``file_ds`` (cached in memory or a file when ``cache``)."""
        cfg = self.cfg
        ds = file_ds.interleave(
            self._read,
            cycle_length=_tune(cfg.interleave_cycle_length),
            num_parallel_calls=_tune(cfg.num_parallel_reads),
            deterministic=self.ordered,
        )
        if self.vectorized:  # parse blocks of records
            ds = ds.batch(PARSE_BLOCK)
        ds = ds.map(
            self.parse, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=self.ordered
        )
        if cache and cfg.cache == "file":  # blocks: fewer, larger elements to write and read back
            path = _file_cache(
                cfg, self.files, self.training, self.pipelines, self.pipeline_id, self.cache_path
            )
            ds = ds.cache(_pipeline_path(path, self.pipeline_id))
        if self.vectorized:
            ds = ds.unbatch()
        # Single records, so that a shuffle can hold every one of them by reference.
        return ds.cache() if cache and cfg.cache == "memory" else ds


def _evaluation_pass(reader: _Reader, batch_size: int, resize: Augment | None) -> tf.data.Dataset:
    """One ordered pass over every record of the pipeline, resized and normalized as evaluated."""
    cfg = reader.cfg
    ds = reader.records_of(reader.file_dataset(), cache=True).batch(batch_size)
    if resize is not None:
        ds = ds.map(resize, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=True)
    evaluate = eval_transform(cfg)  # crop_flip's central window, data.normalize
    return ds.apply(evaluate) if evaluate is not None else ds


def _training_stream(
    reader: _Reader,
    batch_size: int,
    group: int,
    num_records: int | None,
    start_step: int,
    served: bool,
    service_job: str,
    augment: Augment | None,
    resize: Augment | None,
) -> tf.data.Dataset:
    """The endless stream of shuffled passes from ``start_step`` on (see :func:`build`).

    Training drops the remainder at a global step's size, so that every epoch's steps hold the
    same examples whatever the replica count (mirrored on 2 devices trains exactly like one device).
    """
    cfg, files, pipelines, seed = reader.cfg, reader.files, reader.pipelines, reader.seed
    file_ds = reader.file_dataset()
    if pipelines == 1 and num_records is not None:
        counts = [num_records]
    else:
        counts = [scan_tfrecord(f) for f in files]
    per_pass = batches_per_pass(counts, pipelines, reader.by_file, batch_size * group)
    # Sized to the records, not beyond: tf.data allocates the whole buffer up front.
    full = -(-sum(counts) // pipelines) if reader.by_record else sum(counts)
    buffer = full if cfg.cache == "memory" else cfg.shuffle_buffer
    cached = reader.records_of(file_ds, cache=True) if cfg.cache != "none" else None

    def one_pass(index):
        # A graph-level seed of this function's own: with a tensor op seed, TensorFlow's seed
        # logic fails when the global seed is 0, and the order must not depend on it anyway.
        tf.random.set_seed(_PASS_GRAPH_SEED)
        records = cached
        if records is None:  # re-read the files, in this pass's order
            records = reader.records_of(
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
    start = (int(start_step) - (skip if served else 0)) * group  # stream index of the first batch
    if resize is not None:
        ds = ds.map(resize, num_parallel_calls=_tune(cfg.num_parallel_calls), deterministic=None)
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
            ds.with_options(_options(cfg, True, sharded=False)),
            cfg,
            training=True,
            job_name=service_job,
        )
    return ds


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


def _pipeline_path(path: str, pipeline_id) -> str | tf.Tensor:
    """``path`` with ``{id}`` replaced by ``pipeline_id`` when that is a tensor (a worker index known
    only when the worker runs the dataset function, see ``per_worker_context``)."""
    if isinstance(pipeline_id, int) or "{id}" not in path:
        return path
    head, tail = path.split("{id}", 1)
    return tf.strings.join([head, tf.strings.as_string(pipeline_id), tail])


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
    files = split_of(info, split).files
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
        num_records=split_of(info, split).num_records,
        start_step=start_step,
        service_job=service_job,
        resize=resize_fn(info),
    )


def load_split(
    data_cfg: DataConfig, split: str = "test", limit: int = 0, info: DatasetInfo | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Reads a held-out split into memory as ``(images float32, labels int64)``.

    Args:
        data_cfg: Which dataset and where it is cached.
        split: ``test`` (default) or ``validation``.
        limit: Keep only the first N examples (0 = all).
        info: The prepared dataset, when already at hand.
    """
    cfg = dataclasses.replace(data_cfg, cache="none")
    xs, ys, n = [], [], 0
    for x, y in make_dataset(cfg, split, training=False, info=info).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
        n += len(y)
        if limit and n >= limit:
            break
    if not xs:
        raise DataError(
            f"the {split!r} split of {data_cfg.dataset!r} is empty; nothing to evaluate on"
        )
    x, y = np.concatenate(xs), np.concatenate(ys)
    return (x[:limit], y[:limit]) if limit else (x, y)
