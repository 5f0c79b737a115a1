"""The crop_flip augmentation and data.normalize against an independent numpy computation."""

import dataclasses

from tfopt.core._keras import tf

import numpy as np
import pytest

from tfopt.config import DataConfig, apply_overrides, from_dict, parse_normalize
from tfopt.core.errors import ConfigError
from tfopt.data import build, make_dataset, parse_fn, prepare
from tfopt.data.augment import crop_flip_augment, crop_flip_draws, eval_transform

MEAN, STD = (0.2, 0.4, 0.6), (0.5, 0.25, 0.125)


def numpy_crop_flip(images, oy, ox, flip, crop, padding, mean=(0.0,), std=(1.0,)):
    """The reference: pad, slice each window, mirror it, scale integers to [0, 1], normalize."""
    x = images.astype(np.float64) / (255.0 if images.dtype == np.uint8 else 1.0)
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    out = []
    for k in range(len(x)):
        window = x[k, oy[k] : oy[k] + crop[0], ox[k] : ox[k] + crop[1]]
        out.append(window[:, ::-1] if flip[k] else window)
    return (np.stack(out) - np.asarray(mean)) / np.asarray(std)


def batches(images, repeats=1):
    return tf.data.Dataset.from_tensors((images, np.arange(len(images)))).repeat(repeats)


@pytest.mark.parametrize(
    "dtype, crop, padding", [(np.uint8, 6, 0), (np.uint8, 0, 2), (np.float32, 9, 1)]
)
@pytest.mark.slow
def test_crop_flip_equals_numpy_with_the_same_draws(dtype, crop, padding):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (16, 10, 12, 3)).astype(dtype)
    if dtype == np.float32:
        images /= 255.0
    cfg = DataConfig(
        augment="crop_flip",
        crop_size=crop,
        crop_padding=padding,
        normalize=",".join(map(str, MEAN)) + "/" + ",".join(map(str, STD)),
    )
    window = (crop, crop) if crop else (10, 12)
    space = (10 + 2 * padding, 12 + 2 * padding)
    got = [
        (x.numpy(), y.numpy())
        for x, y in batches(images, 3).apply(crop_flip_augment(cfg, seed=7, start=40))
    ]
    for i, (x, y) in enumerate(got):
        oy, ox, flip = (t.numpy() for t in crop_flip_draws(7, 40 + i, 16, space, window))
        assert x.dtype == np.float32 and x.shape == (16, *window, 3)
        np.testing.assert_allclose(
            x,
            numpy_crop_flip(images, oy, ox, flip, window, padding, MEAN, STD),
            rtol=1e-6,
            atol=1e-6,
        )
        np.testing.assert_array_equal(y, np.arange(16))
    assert not np.array_equal(got[0][0], got[1][0])  # every batch draws anew


def test_draws_are_a_function_of_seed_and_batch_index_and_cover_the_range():
    def draws(seed, index):
        return [t.numpy() for t in crop_flip_draws(seed, index, 4000, (20, 30), (16, 10))]

    oy, ox, flip = draws(3, 5)
    for a, b in zip(draws(3, 5), (oy, ox, flip)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(draws(3, 6)[0], oy) and not np.array_equal(draws(4, 5)[0], oy)
    assert sorted(set(oy)) == list(range(5)) and sorted(set(ox)) == list(
        range(21)
    )  # every window position
    assert (
        abs(flip.mean() - 0.5) < 0.03 and abs(np.corrcoef(oy, ox)[0, 1]) < 0.05
    )  # fair, independent


def test_a_stream_started_later_augments_like_the_tail_of_the_whole_one():
    images = np.random.default_rng(2).integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    cfg = DataConfig(augment="crop_flip", crop_size=5)
    whole = [
        x.numpy() for x, _ in batches(images, 6).apply(crop_flip_augment(cfg, seed=1, start=0))
    ]
    tail = [x.numpy() for x, _ in batches(images, 2).apply(crop_flip_augment(cfg, seed=1, start=4))]
    np.testing.assert_array_equal(np.stack(tail), np.stack(whole[4:]))


def test_evaluation_gets_the_central_window_and_the_same_normalization():
    images = np.random.default_rng(3).integers(0, 256, (5, 10, 12, 3)).astype(np.uint8)
    cfg = DataConfig(augment="crop_flip", crop_size=6, crop_padding=1, normalize="imagenet")
    x, _ = next(iter(batches(images).apply(eval_transform(cfg))))
    mean, std = parse_normalize("imagenet")
    oy, ox = np.full(5, (12 - 6) // 2), np.full(5, (14 - 6) // 2)
    expected = numpy_crop_flip(images, oy, ox, np.zeros(5, bool), (6, 6), 1, mean, std)
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6, atol=1e-6)
    assert (
        eval_transform(DataConfig(augment="shift")) is None and eval_transform(DataConfig()) is None
    )


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    cfg = DataConfig(
        dataset="digits",
        data_dir=str(tmp_path_factory.mktemp("augment-data")),
        limit=200,
        num_shards=2,
        global_batch_size=20,
        deterministic=True,
    )
    return cfg, prepare(cfg)


@pytest.mark.slow
def test_normalize_alone_applies_to_training_and_evaluation_batches(digits):
    cfg, info = digits
    files, parse = info.splits["train"].files, parse_fn(info, "train")
    plain = dataclasses.replace(cfg, cache="none")
    normalized = dataclasses.replace(plain, normalize="0.25/0.5")
    for training in (False, True):
        a = next(iter(build(files, parse, plain, training=training, batch_size=20)))[0].numpy()
        b = next(iter(build(files, parse, normalized, training=training, batch_size=20)))[0].numpy()
        np.testing.assert_allclose(b, (a - 0.25) / 0.5, rtol=1e-6, atol=1e-6)


def test_make_dataset_with_crop_flip_trains_at_the_dataset_shape(digits):
    cfg, info = digits
    cfg = dataclasses.replace(cfg, augment="crop_flip", crop_padding=2, normalize="0.5/0.5")
    x, _ = next(iter(make_dataset(cfg, "train", training=True, info=info)))
    assert (
        x.shape == (20, 8, 8, 1)
        and float(tf.reduce_min(x)) >= -1.0
        and float(tf.reduce_max(x)) <= 1.0
    )
    with pytest.raises(
        ConfigError,
        match=r"data.crop_size=6 makes 6x6 training images .* 8x8; use data.crop_size=0",
    ):
        make_dataset(dataclasses.replace(cfg, crop_size=6), "train", training=True, info=info)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "data.augment=crop",
            "data.augment='crop' is not valid; choose one of none, shift, crop_flip",
        ),
        ("data.crop_size=8", "data.crop_size=8 has no effect with data.augment=none"),
        (
            "data.crop_padding=4",
            "data.crop_padding=4 has no effect with data.augment=none; set data.augment=crop_flip",
        ),
        ("data.normalize=0.5", "data.normalize='0.5' is not valid; give MEAN/STD per channel"),
        ("data.normalize=0.5/0,1,1", "data.normalize='0.5/0,1,1' has a standard deviation <= 0"),
        ("data.normalize=a/b", "data.normalize='a/b' is not valid"),
    ],
)
def test_config_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        apply_overrides(from_dict({}), [override])
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="data.crop_size=-2 must be >= 0"):
        from_dict({"data": {"augment": "crop_flip", "crop_size": -2}})
    cfg = apply_overrides(
        from_dict({}), ["data.augment=crop_flip", "data.crop_size=24", "data.normalize=imagenet"]
    )
    assert (cfg.data.crop_size, parse_normalize(cfg.data.normalize)[1]) == (
        24,
        (0.229, 0.224, 0.225),
    )


@pytest.mark.parametrize(
    "cfg, message",
    [
        (
            DataConfig(augment="crop_flip", crop_size=13),
            "data.crop_size=13 is larger than the 10x12 images",
        ),
        (
            DataConfig(augment="crop_flip", normalize="0.5,0.5/1"),
            "gives 2 mean values for 3-channel images",
        ),
    ],
)
def test_errors_found_when_the_images_are_known(cfg, message):
    images = np.zeros((2, 10, 12, 3), np.uint8)
    with pytest.raises(ConfigError, match=message):
        batches(images).apply(crop_flip_augment(cfg, seed=0))
