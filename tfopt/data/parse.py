"""From a serialized record to ``(image, label)``: the parse functions of every shard layout, and
the resize every batch gets before augmentation."""

from __future__ import annotations

from collections.abc import Callable

from tfopt.core._keras import tf

from tfopt.core.errors import DataError
from tfopt.data.sources import DatasetInfo

#: ``(images, labels) -> (images, labels)`` on batches.
Augment = Callable[[tf.Tensor, tf.Tensor], tuple]


def split_of(info: DatasetInfo, split: str):
    """``info``'s split called ``split``.

    Raises:
        DataError: no such split (the message lists the splits).
    """
    if split not in info.splits:
        raise DataError(f"split {split!r} does not exist; choose one of {', '.join(info.splits)}")
    return info.splits[split]


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
    encoding = split_of(info, split).encoding
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
