"""``folder:PATH`` sources, ``data.image_size`` and ``data.channels``: every image reaches the pipeline
with its own label, resized as asked, and every bad folder is one line naming the file or folder."""

import os
import sys

from tfopt.core._keras import tf

import numpy as np
import pytest
from image_folder import constant_folder, digits_folder, write_image

from tfopt.config import DataConfig
from tfopt.core.errors import ConfigError, DataError
from tfopt.data import make_dataset, prepare
from tfopt.data.sources import dataset_dir

NAMES = ["cat", "dog", "eel"]


def _cfg(tmp_path, root, **kw):
    return DataConfig(dataset=f"folder:{root}", data_dir=str(tmp_path / "data"), num_shards=2, **kw)


def _all(cfg, split, info=None):
    xs, ys = [], []
    for x, y in make_dataset(cfg, split, training=False, info=info).as_numpy_iterator():
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.slow
def test_class_folders_are_split_80_10_10_and_every_image_keeps_its_label(tmp_path):
    root = str(tmp_path / "photos")
    values = constant_folder(root, {None: {"cat": 20, "dog": 10, "eel": 30}})
    cfg = _cfg(tmp_path, root, image_size="9x7", channels=3)
    info = prepare(cfg)
    assert info.class_names == tuple(NAMES) and info.num_classes == 3
    assert info.image_shape == (9, 7, 3) and info.stored_shape == (None, None, 3)
    # per class: round(10%) test, round(10%) validation (at least one each), the rest train
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 48,
        "validation": 6,
        "test": 6,
    }
    seen = []
    for split in ("train", "validation", "test"):
        x, y = _all(cfg, split, info)
        assert x.shape[1:] == (9, 7, 3) and x.dtype == np.float32
        # A flat image stays flat through decoding, resizing and gray -> RGB: its value names its class.
        assert np.allclose(x, x[:, :1, :1, :1], atol=1.5 / 255)
        pixel = np.rint(x[:, 0, 0, 0] * 255)
        np.testing.assert_array_equal(pixel // 40, y)
        seen += list(zip(y.tolist(), pixel.tolist()))
    expected = sorted(
        (NAMES.index(os.path.basename(os.path.dirname(p))), v) for p, v in values.items()
    )
    assert sorted((int(a), int(b)) for a, b in seen) == [(a, float(b)) for a, b in expected]


def test_split_folders_are_used_as_given_and_a_missing_one_is_carved_from_train(tmp_path):
    root = str(tmp_path / "split")
    constant_folder(
        root,
        {
            "train": {"cat": 12, "dog": 12},
            "val": {"cat": 2, "dog": 3},
            "test": {"cat": 4, "dog": 1},
        },
        formats=("png",),
        sizes=((8, 8),),
    )
    info = prepare(_cfg(tmp_path, root))
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 24,
        "validation": 5,
        "test": 5,
    }
    assert (
        info.image_shape == (8, 8, 1) and info.stored_shape is None
    )  # one size, all gray: as stored
    root2 = str(tmp_path / "no_val")
    constant_folder(
        root2,
        {"train": {"cat": 12, "dog": 12}, "test": {"cat": 2, "dog": 2}},
        formats=("png",),
        sizes=((8, 8),),
    )
    info = prepare(_cfg(tmp_path, root2))
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 20,
        "validation": 4,
        "test": 4,
    }


@pytest.mark.slow
def test_resize_and_channels_of_a_fixed_size_source_are_tf_image_on_the_stored_batch(tmp_path):
    plain = DataConfig(dataset="digits", data_dir=str(tmp_path / "data"), num_shards=2)
    x, y = _all(plain, "test")
    resized = DataConfig(
        dataset="digits",
        data_dir=str(tmp_path / "data"),
        num_shards=2,
        image_size="20x12",
        channels=3,
    )
    info = prepare(resized)
    assert info.image_shape == (20, 12, 3) and info.stored_shape == (8, 8, 1)
    xr, yr = _all(resized, "test", info)
    np.testing.assert_array_equal(yr, y)
    expected = tf.image.resize(np.repeat(x, 3, axis=3), (20, 12)).numpy()
    np.testing.assert_allclose(xr, expected, atol=1e-6)
    train = next(iter(make_dataset(resized, "train", training=True, info=info)))[0]
    assert tuple(train.shape[1:]) == (20, 12, 3)


def test_rgb_to_gray_is_luma(tmp_path):
    root = str(tmp_path / "rgb")
    for label, color in enumerate(((255, 0, 0), (0, 0, 255))):
        for i in range(5):
            write_image(
                os.path.join(root, f"c{label}", f"{i}.png"), np.tile(np.uint8(color), (6, 6, 1))
            )
    cfg = _cfg(tmp_path, root, channels=1)
    x, y = _all(cfg, "train")
    assert x.shape[1:] == (6, 6, 1)
    luma = {0: 0.2989, 1: 0.1140}  # ITU-R 601 weights of red and blue
    for xi, yi in zip(x, y):
        assert abs(xi.mean() - luma[int(yi)]) < 2e-3


def test_a_changed_folder_is_materialized_again(tmp_path):
    root = str(tmp_path / "grow")
    constant_folder(root, {None: {"cat": 5, "dog": 5}}, formats=("png",), sizes=((8, 8),))
    cfg = _cfg(tmp_path, root)
    before = dataset_dir(cfg)
    assert prepare(cfg).splits["train"].num_records == 6
    write_image(os.path.join(root, "cat", "new.png"), np.zeros((8, 8, 1), np.uint8))
    assert dataset_dir(cfg) != before
    assert prepare(cfg).splits["train"].num_records == 7


def test_digits_folder_is_real_data_with_its_labels(tmp_path):
    root = digits_folder(str(tmp_path / "digits"), per_class=10)
    cfg = _cfg(tmp_path, root)
    info = prepare(cfg)
    assert info.class_names == tuple(f"digit_{k}" for k in range(10)) and info.image_shape == (
        32,
        32,
        3,
    )
    x, y = _all(cfg, "test", info)
    assert len(y) == 10 and sorted(y.tolist()) == list(range(10))


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda r: constant_folder(r, {None: {"only": 5}}),
            r"has 1 class subfolder\(s\) \(only\); give one subfolder per class",
        ),
        (
            lambda r: (constant_folder(r, {None: {"cat": 5}}), os.makedirs(os.path.join(r, "dog"))),
            r"class folder '.*dog' holds no image",
        ),
        (
            lambda r: (
                constant_folder(r, {None: {"cat": 5, "dog": 5}}),
                open(os.path.join(r, "dog", "broken.jpg"), "wb").write(b"not an image at all"),
            ),
            r"image '.*dog/broken.jpg' cannot be decoded",
        ),
        (
            lambda r: (
                constant_folder(r, {None: {"cat": 5, "dog": 5}}),
                open(os.path.join(r, "cat", "empty.png"), "wb").close(),
            ),
            r"image '.*cat/empty.png' is empty \(0 bytes\)",
        ),
        (
            lambda r: constant_folder(
                r, {"train": {"cat": 5, "dog": 5}, "test": {"cat": 1, "emu": 1}}
            ),
            r"test class folder 'emu' is not a class of train \(cat, dog\)",
        ),
        (
            lambda r: constant_folder(r, {None: {"cat": 5, "dog": 2}}),
            r"class folder '.*dog' has 2 image\(s\), too few",
        ),
        (lambda r: None, r"is not a directory; give folder:PATH"),
    ],
)
def test_bad_folders_are_one_line_naming_what_to_fix(tmp_path, make, match):
    root = str(tmp_path / "bad")
    make(root)
    with pytest.raises(DataError, match=match) as e:
        prepare(_cfg(tmp_path, root, image_size="8x8"))
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "data") or not any(
        f.endswith("manifest.json") for _, _, fs in os.walk(tmp_path / "data") for f in fs
    )


def test_images_of_several_sizes_need_an_image_size(tmp_path):
    root = str(tmp_path / "sizes")
    constant_folder(root, {None: {"cat": 4, "dog": 4}})
    with pytest.raises(DataError, match=r"have different sizes; give --image-size HxW"):
        prepare(_cfg(tmp_path, root))
    for bad in ("96", "0x5", "ax3", "1x2x3"):
        if bad == "96":
            assert prepare(_cfg(tmp_path, root, image_size=bad)).image_shape[:2] == (96, 96)
            continue
        with pytest.raises(ConfigError, match="data.image_size=.* give HEIGHTxWIDTH"):
            from tfopt.config import from_dict

            from_dict({"data": {"image_size": bad}})


@pytest.mark.slow
def test_a_tfds_dataset_of_varying_sizes_is_resized(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tfds_builders"))
    import varying_sizes  # noqa: F401  (registers tfds:varying_sizes)

    cfg = DataConfig(dataset="tfds:varying_sizes", data_dir=str(tmp_path / "data"), num_shards=2)
    with pytest.raises(DataError, match="have different sizes; give --image-size HxW"):
        prepare(cfg)
    cfg = DataConfig(
        dataset="tfds:varying_sizes",
        data_dir=str(tmp_path / "data"),
        num_shards=2,
        image_size="24x20",
    )
    info = prepare(cfg)
    assert info.class_names == ("dark", "light") and info.image_shape == (24, 20, 3)
    x, y = _all(cfg, "test", info)
    assert x.shape == (10, 24, 20, 3)
    np.testing.assert_array_equal(np.rint(x[:, 5, 5, 0] * 255), np.where(y == 1, 180, 60))
    assert np.bincount(y).tolist() == [5, 5]


@pytest.mark.slow
def test_a_source_written_as_a_folder_reads_back_the_same_images(tmp_path):
    from tfopt.data.to_folder import main

    source = DataConfig(dataset="digits", data_dir=str(tmp_path / "data"), num_shards=2, limit=60)
    assert (
        main(
            ["digits", str(tmp_path / "out"), "--limit", "60", "--data-dir", str(tmp_path / "data")]
        )
        == 0
    )
    assert sorted(os.listdir(tmp_path / "out")) == ["test", "train", "val"]
    back = _cfg(tmp_path, tmp_path / "out")
    info = prepare(back)
    assert info.class_names == tuple(f"class_{k}" for k in range(10)) and info.image_shape == (
        8,
        8,
        1,
    )
    for split in ("train", "validation", "test"):
        x, y = _all(source, split)
        xb, yb = _all(back, split, info)
        order, order_b = (
            np.lexsort(x.reshape(len(x), -1).T),
            np.lexsort(xb.reshape(len(xb), -1).T),
        )
        np.testing.assert_array_equal(xb[order_b], x[order])  # PNG is lossless
        np.testing.assert_array_equal(yb[order_b], y[order])
    assert main(["digits", str(tmp_path / "out")]) == 2  # never written over


def _example(image_bytes, label, image_key, label_key):
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                image_key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_bytes])),
                label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    ).SerializeToString()


@pytest.mark.slow
def test_tfrecords_with_their_own_feature_names_sizes_and_labels_file(tmp_path):
    """The TF-Slim / Object Detection API layout: JPEGs of any size under image/encoded, image/class/label."""
    for k, (split, n) in enumerate((("train", 12), ("val", 4), ("test", 6))):
        with tf.io.TFRecordWriter(str(tmp_path / f"{split}-00000.tfrecord")) as w:
            for i in range(n):
                value = 60 + 120 * (i % 2)
                jpeg = tf.io.encode_jpeg(
                    np.full((10 + i + k, 14 + 2 * i, 3), value, np.uint8), quality=100
                ).numpy()
                w.write(_example(jpeg, i % 2, "image/encoded", "image/class/label"))
    (tmp_path / "labels.txt").write_text("dark\nlight\n")
    spec = f"image=jpeg,image_key=image/encoded,label_key=image/class/label,labels={tmp_path / 'labels.txt'}"
    cfg = DataConfig(
        dataset=f"tfrecord:{tmp_path}/*.tfrecord",
        feature_spec=spec,
        data_dir=str(tmp_path / "data"),
        image_size="16x16",
    )
    info = prepare(cfg)
    assert info.class_names == ("dark", "light") and info.image_shape == (16, 16, 3)
    x, y = _all(cfg, "test", info)
    assert x.shape == (6, 16, 16, 3)
    np.testing.assert_allclose(np.rint(x[:, 8, 8, 0] * 255), np.where(y == 1, 180, 60), atol=1)
    with pytest.raises(
        DataError, match=r"the first image of .* is .*; give every image one shape, or resize"
    ):
        prepare(DataConfig(dataset=cfg.dataset, feature_spec=spec, data_dir=str(tmp_path / "data")))
    with pytest.raises(
        DataError,
        match=r"need a bytes 'image' and an int64 'label' feature; name others with image_key=",
    ):
        prepare(
            DataConfig(
                dataset=cfg.dataset,
                feature_spec="image=jpeg",
                data_dir=str(tmp_path / "data"),
                image_size="16x16",
            )
        )
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'image_name' \(valid keys: image, label, classes, image_key",
    ):
        prepare(
            DataConfig(
                dataset=cfg.dataset,
                feature_spec="image=jpeg,image_name=x",
                data_dir=str(tmp_path / "d"),
            )
        )
