"""The ``crop_flip`` augmentation and per-channel normalization, applied to whole batches.

``data.augment=crop_flip`` (training only; after the cache, the shuffle and the batching):

1. pad every image with ``data.crop_padding`` zero pixels on each side (default 0);
2. take a random ``data.crop_size`` x ``data.crop_size`` window of it (0 = the image's own
   height x width: with padding that is the "pad 4, crop 32" augmentation of CIFAR training;
   without, "crop 112 of a 128 image" as in ImageNet training);
3. mirror it left-right with probability 1/2;
4. return float32, scaled to [0, 1] when the images are integers (e.g. uint8 pixels cached by a
   parse function), then normalized when ``data.normalize`` is set.

Each image of a batch gets its own window and flip, drawn by a stateless generator from
(``data.seed``, the batch's index in the training stream): a stream resumed at batch ``g``
augments exactly as the uninterrupted one (the same rule as ``shift``). The whole batch is one
gather-gather-multiply-add expression, XLA-compiled when this TensorFlow build has XLA (TF's own
gather kernel copies 3-byte pixels one at a time and costs several times more CPU).

Evaluation batches get the deterministic counterpart: the central window (no flip), the same
scaling and normalization, so that a model sees inputs of one shape and distribution.

``data.normalize`` (``MEAN/STD`` per channel in units of the [0, 1] image, e.g.
``0.485,0.456,0.406/0.229,0.224,0.225``, or ``imagenet``) applies to training and evaluation
batches whatever the augmentation: ``(x - mean) / std``; with a ``bgr:`` prefix the channels are
reversed first (the ``caffe`` preprocessing of ``keras.applications`` ResNet50 and VGG).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from tfopt.core._keras import tf

from tfopt.config import DataConfig, feed_normalize, parse_normalize, reverses_channels
from tfopt.core.errors import ConfigError

_ENDLESS = 2**62  # batch indices of a training stream: never reached
Transform = Callable[[tf.data.Dataset], tf.data.Dataset]


@functools.lru_cache(maxsize=1)
def xla_available() -> bool:
    """True when XLA can JIT-compile on this machine's CPU (it is optional in some TF builds)."""
    with tf.init_scope():  # probe eagerly even when called while a dataset function is traced
        try:
            tf.function(lambda x: x * 2.0, jit_compile=True)(tf.ones([2]))
            return True
        except Exception:  # noqa: BLE001 - any failure means: do without XLA
            return False


def crop_flip_draws(
    seed, index, n, space: Sequence[int], crop: Sequence[int]
) -> tuple[tf.Tensor, ...]:
    """The random windows and flips of one batch, a pure function of (``seed``, ``index``).

    Args:
        seed: The pipeline's seed (int or int64 tensor).
        index: The batch's index in the training stream (int or int64 tensor).
        n: Images in the batch (int or int32 tensor).
        space: (height, width) of the padded images the windows are taken from.
        crop: (height, width) of the windows.

    Returns:
        ``(oy, ox, flip)``: int32 [n] top rows in ``[0, space[0] - crop[0]]``, int32 [n] left
        columns in ``[0, space[1] - crop[1]]``, bool [n] left-right mirror decisions.
    """
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])
    ky, kx, kf = tf.unstack(tf.random.experimental.stateless_split(key, 3))
    shape = tf.reshape(tf.cast(n, tf.int32), [1])
    oy = tf.random.stateless_uniform(
        shape, ky, minval=0, maxval=space[0] - crop[0] + 1, dtype=tf.int32
    )
    ox = tf.random.stateless_uniform(
        shape, kx, minval=0, maxval=space[1] - crop[1] + 1, dtype=tf.int32
    )
    flip = tf.random.stateless_uniform(shape, kf) < 0.5
    return oy, ox, flip


def _scale_bias(
    normalize: str, channels: int, dtype: tf.DType
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (scale, bias) with ``x * scale + bias == (x * unit - mean) / std``, where ``unit``
    maps integer pixels to [0, 1] (1 for float images). Python floats: constants are made inside
    each traced function, whichever graph it belongs to."""
    mean, std = parse_normalize(normalize) or ((0.0,), (1.0,))
    for name, values in (("mean", mean), ("std", std)):
        if len(values) not in (1, channels):
            raise ConfigError(
                f"data.normalize={normalize!r} gives {len(values)} {name} values for "
                f"{channels}-channel images; give 1 or {channels}"
            )
    mean = mean * channels if len(mean) == 1 else mean
    std = std * channels if len(std) == 1 else std
    unit = 1.0 / 255.0 if dtype.is_integer else 1.0
    return tuple(unit / s for s in std), tuple(-m / s for m, s in zip(mean, std))


def _crop_flip_normalize(
    images,
    oy,
    ox,
    flip,
    *,
    padding: int,
    crop: tuple[int, int],
    scale: tuple[float, ...],
    bias: tuple[float, ...],
    bgr: bool = False,
):
    """The batch kernel: pad, window rows, window columns (reversed where flipped), multiply-add."""
    if padding:
        images = tf.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    ch, cw = crop
    rows = oy[:, None] + tf.range(ch)[None, :]
    ar = tf.range(cw)
    cols = ox[:, None] + tf.where(flip[:, None], (cw - 1) - ar[None, :], ar[None, :])
    x = tf.gather(images, rows, axis=1, batch_dims=1)  # [n, ch, W, C]
    x = tf.gather(x, cols, axis=2, batch_dims=1)  # [n, ch, cw, C]
    return _affine(x, scale, bias, bgr)


def _affine(x, scale: tuple[float, ...], bias: tuple[float, ...], bgr: bool):
    """``x * scale + bias`` in float32, the channels reversed first when ``bgr``."""
    x = tf.cast(x, tf.float32)
    return (tf.reverse(x, axis=[-1]) if bgr else x) * tf.constant(scale) + tf.constant(bias)


@functools.lru_cache(maxsize=64)
def _kernel(
    padding: int,
    crop: tuple[int, int],
    scale: tuple[float, ...],
    bias: tuple[float, ...],
    bgr: bool = False,
) -> Callable:
    """One kernel per setting for the whole process: every pipeline built with the same settings
    (training and evaluation, a rebuilt or resumed one) reuses its XLA compilation."""
    fn = functools.partial(
        _crop_flip_normalize, padding=padding, crop=crop, scale=scale, bias=bias, bgr=bgr
    )
    return tf.function(fn, jit_compile=True) if xla_available() else fn


class _Window:
    """Crops, flips, scales and normalizes batches of one static image shape (see the module doc)."""

    def __init__(self, cfg: DataConfig, image_shape: tf.TensorShape, dtype: tf.DType):
        h, w, c = image_shape[-3:]
        if h is None or w is None or c is None:
            raise ConfigError(
                f"data.augment={cfg.augment} needs images of a static shape, got {image_shape}; "
                "make the parse function return fixed-size images (e.g. resize them)"
            )
        p = cfg.crop_padding
        self.space = (h + 2 * p, w + 2 * p)
        self.crop = (cfg.crop_size, cfg.crop_size) if cfg.crop_size else (h, w)
        if self.crop[0] > self.space[0] or self.crop[1] > self.space[1]:
            raise ConfigError(
                f"data.crop_size={cfg.crop_size} is larger than the {self.space[0]}x{self.space[1]} "
                f"images (padding {p} included); choose at most {min(self.space)}"
            )
        self.out_shape = (self.crop[0], self.crop[1], c)
        self._kernel = _kernel(
            p,
            self.crop,
            *_scale_bias(feed_normalize(cfg), c, dtype),
            reverses_channels(cfg.normalize),
        )

    def __call__(self, images, oy, ox, flip):
        return tf.ensure_shape(
            self._kernel(images, oy, ox, flip), [images.shape[0], *self.out_shape]
        )

    def center(self, images):
        n = tf.shape(images)[0]
        oy = tf.fill([n], (self.space[0] - self.crop[0]) // 2)
        ox = tf.fill([n], (self.space[1] - self.crop[1]) // 2)
        return self(images, oy, ox, tf.zeros([n], tf.bool))


def crop_flip_augment(cfg: DataConfig, seed: int, start: int = 0) -> Transform:
    """Returns a dataset transformation: ``data.augment=crop_flip`` on ``(images, labels)`` batches.

    Args:
        cfg: ``crop_size``, ``crop_padding`` and ``normalize`` are read from it.
        seed: The seed of the batch draws (the input pipeline's seed).
        start: The stream index of the first batch (a resumed run's first batch).

    Returns:
        ``ds -> ds`` giving float32 ``[B, crop, crop, C]`` images, labels unchanged.

    Raises:
        ConfigError: when applied: the crop does not fit the images, ``normalize`` does not match
            their channels, or their shape is not static.
    """

    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        window = _Window(cfg, ds.element_spec[0].shape, ds.element_spec[0].dtype)

        def augment(batch, index):
            images, labels = batch
            oy, ox, flip = crop_flip_draws(
                seed, index, tf.shape(images)[0], window.space, window.crop
            )
            return window(images, oy, ox, flip), labels

        indices = tf.data.Dataset.range(start, _ENDLESS)
        return tf.data.Dataset.zip((ds, indices)).map(augment, num_parallel_calls=tf.data.AUTOTUNE)

    return apply


def eval_transform(cfg: DataConfig) -> Transform | None:
    """Returns what evaluation batches need to look like training ones, or None when nothing.

    With ``crop_flip``: the central window, scaled and normalized like training batches; else
    ``data.normalize`` alone (None when it is off).
    """
    if cfg.augment != "crop_flip" and not feed_normalize(cfg):
        return None

    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        spec = ds.element_spec[0]
        if cfg.augment == "crop_flip":
            window = _Window(cfg, spec.shape, spec.dtype)
            return ds.map(lambda x, y: (window.center(x), y), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.apply(normalize_batches(cfg))

    return apply


def normalize_batches(cfg: DataConfig) -> Transform:
    """Returns a dataset transformation: ``data.normalize`` on ``(images, labels)`` batches (float32 out)."""

    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        spec = ds.element_spec[0]
        if spec.shape.rank != 4 or spec.shape[-1] is None:
            raise ConfigError(
                f"data.normalize needs [batch, height, width, channels] images, got {spec.shape}"
            )
        scale, bias = _scale_bias(feed_normalize(cfg), spec.shape[-1], spec.dtype)
        bgr = reverses_channels(cfg.normalize)
        return ds.map(
            lambda x, y: (_affine(x, scale, bias, bgr), y), num_parallel_calls=tf.data.AUTOTUNE
        )

    return apply


def check_model_shape(cfg: DataConfig, image_shape: Sequence[int]) -> None:
    """Refuses a ``crop_flip`` window that changes the image shape the dataset's models are built for.

    Raises:
        ConfigError: ``data.crop_size`` is set and differs from the dataset's height or width.
    """
    if (
        cfg.augment == "crop_flip"
        and cfg.crop_size
        and tuple(image_shape[:2]) != (cfg.crop_size, cfg.crop_size)
    ):
        h, w = image_shape[:2]
        raise ConfigError(
            f"data.crop_size={cfg.crop_size} makes {cfg.crop_size}x{cfg.crop_size} training images but "
            f"models are built for this dataset's {h}x{w}; use data.crop_size=0 with "
            "data.crop_padding=N (pad, then crop back to the same size)"
        )
