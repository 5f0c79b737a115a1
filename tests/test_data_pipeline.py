"""The tf.data pipeline: parsing, determinism, sharding across pipelines, distribution."""

import collections
import dataclasses
import hashlib
import os
import shutil

from tfopt.core._keras import tf

import numpy as np
import pytest

from tfopt.config import DataConfig
from tfopt.core.errors import ConfigError, DataError
from tfopt.data import build, dataset_fn, distribute, make_dataset, parse_fn, prepare, shift_augment
from tfopt.data.shards import encode_example


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    return str(tmp_path_factory.getbasetemp() / "tfopt-data")


@pytest.fixture(scope="session")
def mnist(data_root):
    cfg = DataConfig(
        dataset="mnist", data_dir=data_root, limit=1000, global_batch_size=32, shuffle_buffer=500
    )
    return cfg, prepare(cfg)


def contexts(n=2):
    return [
        tf.distribute.InputContext(
            num_input_pipelines=n, input_pipeline_id=i, num_replicas_in_sync=n
        )
        for i in range(n)
    ]


def fingerprints(ds):
    """Multiset of record fingerprints (image bytes + label) seen in a dataset of batches."""
    out = []
    for images, labels in ds:
        for image, label in zip(images.numpy(), labels.numpy()):
            out.append(hashlib.sha1(image.tobytes() + bytes([label])).hexdigest())
    return sorted(out)


@pytest.mark.slow
def test_parse_dtype_shape_range(mnist):
    _, info = mnist
    parse = parse_fn(info, "train")
    record = next(iter(tf.data.TFRecordDataset(info.splits["train"].files[0])))
    image, label = parse(record)
    assert image.dtype == tf.float32 and image.shape == (28, 28, 1) and label.dtype == tf.int64
    assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) == 1.0
    assert int(label) == 5  # MNIST's first training image is a 5
    images, labels = parse(tf.stack([record, record]))  # vectorized form, used by build
    assert images.shape == (2, 28, 28, 1) and labels.numpy().tolist() == [5, 5]
    with pytest.raises(DataError, match="'training'"):
        parse_fn(info, "training")


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["png", "jpeg"])
def test_parse_encoded_images(tmp_path, encoding):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images[:40] * (255 / 16)).astype(np.uint8)[..., None]
    encode = tf.io.encode_png if encoding == "png" else lambda x: tf.io.encode_jpeg(x, quality=100)
    for name, sl in (("train", slice(0, 20)), ("val", slice(20, 30)), ("test", slice(30, 40))):
        with tf.io.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
            for img, lab in zip(images[sl], digits.target[sl]):
                w.write(encode_example(encode(img).numpy(), lab))
    cfg = DataConfig(
        dataset=f"tfrecord:{tmp_path}/*.tfrecord",
        data_dir=str(tmp_path / "data"),
        feature_spec=f"image={encoding}:8x8x1,label=int64,classes=10",
        global_batch_size=8,
    )
    ds = make_dataset(cfg, "train", training=False)
    got_images, got_labels = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    got_images, got_labels = np.concatenate(got_images), np.concatenate(got_labels)
    assert got_images.dtype == np.float32 and got_images.shape == (20, 8, 8, 1)
    assert sorted(got_labels.tolist()) == sorted(digits.target[:20].tolist())
    if encoding == "png":  # lossless: exactly the pixels written (eval order = file order here)
        np.testing.assert_array_equal(np.rint(got_images * 255).astype(np.uint8), images[:20])


@pytest.mark.slow
def test_training_batches_are_deterministic(mnist):
    cfg, info = mnist
    cfg = dataclasses.replace(cfg, deterministic=True, augment="shift")
    per_epoch = 1000 // 32
    first = [
        (x.numpy(), y.numpy())
        for x, y in make_dataset(cfg, "train", training=True, info=info).take(per_epoch)
    ]
    again_stream = iter(make_dataset(cfg, "train", training=True, info=info))
    again = [(x.numpy(), y.numpy()) for x, y in (next(again_stream) for _ in range(per_epoch))]
    assert all(x.shape == (32, 28, 28, 1) for x, _ in first)
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    epoch2 = [next(again_stream)[1].numpy() for _ in range(per_epoch)]  # the next pass: reshuffled
    assert not all(np.array_equal(a, b) for (_, a), b in zip(again, epoch2))


@pytest.fixture(scope="session")
def digits8(data_root):
    """1,000 real digits in 8 train shards of 125; a shuffle buffer far smaller than a shard."""
    cfg = DataConfig(
        dataset="digits",
        data_dir=data_root,
        limit=1000,
        num_shards=8,
        global_batch_size=40,
        shuffle_buffer=50,
        deterministic=True,
    )
    return cfg, prepare(cfg)


def record_ids(batches):
    """Fingerprints of the records of some batches, in the order they come."""
    return [
        hashlib.sha1(x.tobytes() + bytes([y])).hexdigest()
        for images, labels in batches
        for x, y in zip(images.numpy(), labels.numpy())
    ]


def training_epochs(cfg, info, epochs):
    """Record order of consecutive epochs of one repeated training dataset (as a training loop sees)."""
    per_epoch = info.splits["train"].num_records // cfg.global_batch_size
    batches = iter(make_dataset(cfg, "train", training=True, info=info))
    return [record_ids(next(batches) for _ in range(per_epoch)) for _ in range(epochs)]


@pytest.mark.slow
def test_memory_cache_reshuffles_every_epoch(digits8):
    cfg, info = digits8
    assert cfg.cache == "memory"
    first, second = training_epochs(cfg, info, 2)
    every = record_ids(make_dataset(cfg, "train", training=False, info=info))
    assert len(every) == 1000 and sorted(first) == sorted(second) == sorted(every)
    assert first != second
    # Not just mixed inside a buffer of 50: each epoch is a fresh permutation of the whole split, so
    # a record's position in one epoch says nothing about its position in the next ...
    position = {r: i for i, r in enumerate(second)}
    assert abs(np.corrcoef(np.arange(1000), [position[r] for r in first])[0, 1]) < 0.2
    # ... and no file comes early or late as a whole: the records of every shard are spread over
    # the epoch (mean position near the middle; a file-by-file order puts them at 1/16, 3/16, ...).
    shard_of = {
        r: i
        for i, f in enumerate(info.splits["train"].files)
        for r in record_ids(
            build([f], parse_fn(info, "train"), cfg, training=False, batch_size=125)
        )
    }
    for epoch in (first, second):
        spots = collections.defaultdict(list)
        for i, r in enumerate(epoch):
            spots[shard_of[r]].append(i / len(epoch))
        assert len(spots) == 8 and all(abs(np.mean(s) - 0.5) < 0.15 for s in spots.values()), (
            spots.keys()
        )
    # Seeded: another build with the same seed gives the same sequence of epoch orders.
    assert training_epochs(cfg, info, 2) == [first, second]
    assert training_epochs(dataclasses.replace(cfg, seed=cfg.seed + 1), info, 1)[0] != first


def test_memory_cache_serves_later_epochs(digits8, tmp_path):
    cfg, info = digits8
    files = []
    for f in info.splits["train"].files:  # copies we can delete once the cache holds them
        files.append(str(tmp_path / os.path.basename(f)))
        shutil.copy(f, files[-1])
    stream = iter(
        build(files, parse_fn(info, "train"), cfg, training=True, batch_size=40)
    )  # counts the records
    first = record_ids(next(stream) for _ in range(25))
    for f in files:
        os.remove(f)
    second = record_ids(
        next(stream) for _ in range(25)
    )  # the next pass: from the cache, the files are gone
    assert len(first) == 1000 and sorted(first) == sorted(second) and first != second


def test_eval_keeps_order_and_every_record(mnist):
    cfg, info = mnist
    runs = [
        [y.numpy() for _, y in make_dataset(cfg, "test", training=False, info=info)]
        for _ in range(2)
    ]
    assert [len(b) for b in runs[0]][-1] == 1000 % 32  # no dropped remainder
    np.testing.assert_array_equal(np.concatenate(runs[0]), np.concatenate(runs[1]))


@pytest.mark.slow
@pytest.mark.parametrize("num_shards, mode", [(8, "file"), (1, "record")])
@pytest.mark.parametrize("training", [False, True])
def test_two_pipelines_cover_every_record_once(data_root, num_shards, mode, training):
    cfg = DataConfig(
        dataset="mnist",
        data_dir=data_root,
        limit=1000,
        num_shards=num_shards,
        global_batch_size=2,
        shuffle_buffer=100,
    )
    info = prepare(cfg)
    assert len(info.splits["validation"].files) == num_shards
    whole = fingerprints(make_dataset(cfg, "validation", training=False, info=info))
    # Training: the first pass of each pipeline's stream (equal shares here: 500 steps of 1 record).
    parts = [
        fingerprints(
            make_dataset(cfg, "validation", training=training, input_context=c, info=info).take(
                500 if training else -1
            )
        )
        for c in contexts(2)
    ]
    assert len(whole) == 1000
    assert sorted(parts[0] + parts[1]) == whole  # together: every record, exactly once
    assert abs(len(parts[0]) - len(parts[1])) <= 250  # and shared out, not all on one side


def test_per_replica_batch_size(mnist):
    cfg, info = mnist
    x, _ = next(
        iter(make_dataset(cfg, "train", training=True, input_context=contexts(2)[0], info=info))
    )
    assert x.shape[0] == 16  # global 32 over 2 replicas
    bad = dataclasses.replace(cfg, global_batch_size=33)
    with pytest.raises(ConfigError, match="global_batch_size=33"):
        make_dataset(bad, "train", training=True, input_context=contexts(2)[0], info=info)
    with pytest.raises(DataError, match="'valid'"):
        make_dataset(cfg, "valid", training=False, info=info)


def test_options(mnist):
    cfg, info = mnist
    cfg = dataclasses.replace(cfg, ram_budget_mb=64, deterministic=False)
    ds = make_dataset(cfg, "train", training=True, input_context=contexts(2)[1], info=info)
    opts = ds.options()
    assert opts.autotune.ram_budget == 64 * 1024 * 1024 and opts.deterministic is False
    assert (
        opts.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    )
    assert make_dataset(cfg, "test", training=False, info=info).options().deterministic is True


def test_shift_augment_translates_by_at_most_two_pixels():
    rng = np.random.default_rng(0)
    images = rng.random((16, 12, 12, 1)).astype(np.float32)
    ds = tf.data.Dataset.from_tensors((images, np.arange(16))).apply(shift_augment(seed=3))
    shifted, labels = next(iter(ds))
    shifted = shifted.numpy()
    assert labels.numpy().tolist() == list(range(16))
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)))
    seen = set()
    for k in range(16):
        matches = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if np.array_equal(shifted[k], padded[k, 2 - dy : 14 - dy, 2 - dx : 14 - dx])
        ]
        assert matches, f"image {k} is not a shift of at most 2 px"
        seen.add(matches[0])
    assert len(seen) > 1  # per-image offsets, not one for the whole batch


def test_custom_augment_and_file_cache(mnist, tmp_path):
    cfg, info = mnist
    cfg = dataclasses.replace(cfg, cache="file")
    cache = str(tmp_path / "cache" / "train")
    ds = build(
        info.splits["train"].files,
        parse_fn(info, "train"),
        cfg,
        training=True,
        batch_size=50,
        augment=lambda x, y: (1.0 - x, y),
        cache_path=cache,
    )
    stream = iter(ds)
    for _ in range(2):  # the second pass reads the file cache
        batches = [next(stream)[0] for _ in range(20)]
        assert len(batches) == 20
        assert (
            float(tf.reduce_max(batches[0])) == 1.0 and float(tf.reduce_mean(batches[0])) > 0.5
        )  # inverted
    assert any(name.startswith("train") for name in os.listdir(tmp_path / "cache"))


def test_dataset_fn_repeats_for_parameter_servers(mnist):
    cfg, info = mnist
    fn = dataset_fn(cfg, "train", training=True, info=info)
    ds = fn(contexts(1)[0])
    assert sum(1 for _ in ds.take(40)) == 40  # more than one epoch of 31 batches


def test_distribute_over_two_replicas(mnist):
    cfg, info = mnist
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dist = distribute(strategy, cfg, "train", training=True, info=info)
    x, y = next(iter(dist))
    per_replica = strategy.experimental_local_results(x)
    assert len(per_replica) == 2 and all(p.shape == (16, 28, 28, 1) for p in per_replica)


@pytest.mark.parametrize(
    "cache, augment, pipelines",
    [
        ("memory", "shift", 1),
        ("none", "none", 1),
        ("file", "none", 1),
        ("memory", "shift", 2),
        ("memory", "crop_flip", 2),
    ],
)
@pytest.mark.slow
def test_stream_resumed_at_a_step_equals_the_uninterrupted_tail(
    digits8, tmp_path, cache, augment, pipelines
):
    cfg, info = digits8
    cfg = dataclasses.replace(
        cfg,
        cache=cache,
        augment=augment,
        data_dir=str(tmp_path),
        crop_padding=2 if augment == "crop_flip" else 0,
    )
    ctx = contexts(pipelines)[-1] if pipelines > 1 else None
    per_pass = 1000 // pipelines // (40 // pipelines)

    def stream(start, n):
        ds = make_dataset(
            cfg, "train", training=True, input_context=ctx, info=info, start_step=start
        )
        return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]

    whole = stream(0, 2 * per_pass + 5)  # more than two passes
    for start in (3, per_pass, per_pass + 7):  # mid-pass, a pass boundary, inside the second pass
        tail = stream(start, len(whole) - start)
        for (x1, y1), (x2, y2) in zip(whole[start:], tail, strict=True):
            np.testing.assert_array_equal(y1, y2)
            np.testing.assert_array_equal(x1, x2)
    passes = [
        sorted(y for _, ys in whole[i * per_pass : (i + 1) * per_pass] for y in ys)
        for i in range(2)
    ]
    assert passes[0] == passes[1]  # every pass: the same records ...
    assert not np.array_equal(
        np.concatenate([y for _, y in whole[:per_pass]]),
        np.concatenate([y for _, y in whole[per_pass : 2 * per_pass]]),
    )  # ... in a new order


@pytest.mark.parametrize("global_seed", [0, 7])
def test_stream_order_ignores_the_global_seed(digits8, global_seed):
    cfg, info = digits8
    tf.random.set_seed(
        global_seed
    )  # 0 once broke TensorFlow's seed logic with per-pass (tensor) seeds
    try:
        got = [y.numpy() for _, y in make_dataset(cfg, "train", training=True, info=info).take(30)]
    finally:
        tf.random.set_seed(None)
    tf.random.set_seed(123)
    try:
        again = [
            y.numpy() for _, y in make_dataset(cfg, "train", training=True, info=info).take(30)
        ]
    finally:
        tf.random.set_seed(None)
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(again))


def test_batches_per_pass_is_the_smallest_share():
    from tfopt.data.pipeline import batches_per_pass

    assert batches_per_pass([100], 1, False, 32) == 3
    assert (
        batches_per_pass([50, 30, 20], 2, True, 10) == 3
    )  # files 0 and 2 hold 70, file 1 holds 30
    assert batches_per_pass([5, 5], 2, False, 2) == 2  # records 0,2,4 | 1,3 of each file: 6 and 4
    with pytest.raises(DataError, match="fewer than one step of 64"):
        batches_per_pass([100], 2, False, 64)
