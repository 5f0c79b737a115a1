"""Peer of B1: the input pipelines of the TensorFlow guide "Better performance with the tf.data API".

Guide: https://www.tensorflow.org/guide/data_performance (source: tensorflow/docs,
site/en/guide/data_performance.ipynb). Written from the guide's description, for B1's data:
TFRecord files of JPEG-encoded images, a ``parse`` function that decodes and resizes one record
(deterministic), then a random crop, a random left-right flip and a per-channel normalization.

``naive`` is the guide's starting point, "a naive pipeline using no tricks": the files are read
one after another (no parallel interleave), ``map`` without ``num_parallel_calls`` runs parse +
crop + flip + normalize one example at a time, then ``batch``; no cache, no prefetch. tf.data's
default options are left as TensorFlow ships them (``default_options=True``): its static
optimizations may still rewrite the graph. Of those, ``map_parallelization`` parallelizes only
stateless map functions (this one draws with the stateful ``tf.image.random_*`` ops, as the
tutorials write it, so it stays sequential) and ``inject_prefetch`` appends a prefetch after the
last transformation. ``default_options=False`` turns those two off: the strictly sequential
variant, reported beside it.

``optimized`` follows the guide's best-practice summary, in its order:

1. parallelize data extraction: ``interleave`` of one ``TFRecordDataset`` per file with
   ``num_parallel_calls=AUTOTUNE``;
2. parallelize the transformation: ``map(parse, num_parallel_calls=AUTOTUNE)`` (decode +
   resize of one JPEG: there is no batched decode op to vectorize it with);
3. cache after the expensive map, in memory ("apply time consuming operations before cache");
4. the random part after the cache, so that every epoch draws anew ("caching partial
   computations": ``map(time_consuming).cache().map(memory_consuming)``): random crop + flip per
   example, parallel map;
5. vectorize the cheap user-defined function: ``batch`` first, then ``map`` the normalization
   over whole batches;
6. ``prefetch(AUTOTUNE)`` as the last transformation, overlapping producer and consumer.

The guide does not shuffle (its pipelines only show performance); neither pipeline here does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tfopt.core._keras import tf

GUIDE = (
    "Better performance with the tf.data API (https://www.tensorflow.org/guide/data_performance)"
)
AUTOTUNE = tf.data.AUTOTUNE


def crop_flip(image: tf.Tensor, crop: int) -> tf.Tensor:
    """A random ``crop`` x ``crop`` window of one image, mirrored left-right half of the time."""
    image = tf.image.random_crop(image, [crop, crop, image.shape[-1]])
    return tf.image.random_flip_left_right(image)


def normalizer(mean: Sequence[float], std: Sequence[float]) -> Callable[[tf.Tensor], tf.Tensor]:
    """``x -> (x / 255 - mean) / std`` in float32 (per channel; works on one image or a batch)."""
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)
    return lambda x: (tf.cast(x, tf.float32) / 255.0 - mean) / std


def naive(
    files: Sequence[str],
    parse: Callable,
    *,
    crop: int,
    mean: Sequence[float],
    std: Sequence[float],
    batch_size: int,
    default_options: bool = True,
) -> tf.data.Dataset:
    """The guide's naive pipeline: sequential read, one map without parallelism, batch.

    Args:
        files: TFRecord paths.
        parse: serialized record -> (uint8 image [H, W, C], label).
        crop, mean, std: the augmentation (random crop side, normalization per channel in [0, 1] units).
        batch_size: images per batch (the last partial batch is dropped, as the tfopt stream does).
        default_options: keep tf.data's default static optimizations; False turns off the two that
            could change this pipeline (map parallelization, prefetch injection).
    """
    normalize = normalizer(mean, std)

    def one_example(serialized):
        image, label = parse(serialized)
        return normalize(crop_flip(image, crop)), label

    ds = tf.data.TFRecordDataset(list(files))  # one file after another
    ds = ds.map(one_example).batch(batch_size, drop_remainder=True)
    if not default_options:
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        ds = ds.with_options(options)
    return ds


def optimized(
    files: Sequence[str],
    parse: Callable,
    *,
    crop: int,
    mean: Sequence[float],
    std: Sequence[float],
    batch_size: int,
) -> tf.data.Dataset:
    """The guide's recommended pipeline (see the module docstring); iterate it once per epoch.

    The first pass fills the cache; later passes read decoded images from memory and only crop,
    flip, batch and normalize.
    """
    normalize = normalizer(mean, std)
    ds = tf.data.Dataset.from_tensor_slices(list(files))
    ds = ds.interleave(
        tf.data.TFRecordDataset, num_parallel_calls=AUTOTUNE
    )  # 1. parallel extraction
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE)  # 2. parallel transformation
    ds = ds.cache()  # 3. the expensive part once
    ds = ds.map(
        lambda x, y: (crop_flip(x, crop), y), num_parallel_calls=AUTOTUNE
    )  # 4. random, after cache
    ds = ds.batch(batch_size, drop_remainder=True)  # 5. vectorized normalization
    ds = ds.map(lambda x, y: (normalize(x), y), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE)  # 6. overlap producer and consumer
