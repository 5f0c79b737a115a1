"""Shards and manifests: corruption is caught and named, builds are atomic and happen once."""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

from tfopt.core._keras import tf

import pytest

from tfopt.config import DataConfig
from tfopt.core.errors import DataError
from tfopt.data import prepare, shards


@pytest.fixture
def digits(tmp_path):
    """A freshly prepared small digits dataset in its own directory (safe to damage)."""
    cfg = DataConfig(dataset="digits", data_dir=str(tmp_path), limit=200, num_shards=4)
    return cfg, prepare(cfg)


def test_layout_and_manifest(digits):
    cfg, info = digits
    directory = os.path.join(cfg.data_dir, "digits", "shards4-limit200")
    assert sorted(os.listdir(directory)) == sorted(
        ["manifest.json", "verified.json"]
        + [
            f"{s}-{i:05d}-of-00004.tfrecord"
            for s in ("train", "validation", "test")
            for i in range(4)
        ]
    )
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["image_shape"] == [8, 8, 1] and manifest["num_classes"] == 10
    assert manifest["encoding"] == "raw" and "scikit-learn" in manifest["description"]
    for entry in manifest["splits"].values():
        assert entry["num_records"] == 200 == sum(s["records"] for s in entry["shards"])
        for shard in entry["shards"]:
            path = os.path.join(directory, shard["file"])
            assert shard["bytes"] == os.path.getsize(path)
            assert shard["sha256"] == shards.sha256_file(path)
            assert sum(1 for _ in tf.data.TFRecordDataset(path)) == shard["records"]
    assert info.splits["train"].files[0] == os.path.join(directory, "train-00000-of-00004.tfrecord")


def test_truncated_shard_is_named(digits):
    cfg, info = digits
    shard = info.splits["train"].files[2]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(DataError) as err:
        prepare(cfg)
    message = str(err.value)
    assert (
        shard in message and "truncated" in message and "delete" in message and "\n" not in message
    )


def test_corrupted_shard_is_named(digits):
    cfg, info = digits
    shard = info.splits["test"].files[1]
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0x01  # one flipped bit: same size, different content
    with open(shard, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(DataError) as err:
        prepare(cfg)
    assert shard in str(err.value) and "corrupted" in str(err.value)


@pytest.fixture
def hashes(monkeypatch):
    """Counts full sha256 passes per shard file name (a build hashes them in a temp directory)."""
    counts = collections.Counter()
    real = shards.sha256_file

    def counting(path):
        counts[os.path.basename(path)] += 1
        return real(path)

    monkeypatch.setattr(shards, "sha256_file", counting)
    return counts


def shard_names(info):
    return sorted(os.path.basename(f) for split in info.splits.values() for f in split.files)


def test_each_shard_is_hashed_once_then_stamped(tmp_path, hashes):
    cfg = DataConfig(dataset="digits", data_dir=str(tmp_path), limit=200, num_shards=4)
    info = prepare(cfg)  # builds, hashing each shard as it is written
    assert prepare(cfg) == info  # size + mtime only
    assert sorted(hashes) == shard_names(info) and set(hashes.values()) == {1}
    prepare(dataclasses.replace(cfg, verify=True))  # data.verify: every shard hashed again
    assert set(hashes.values()) == {2}
    # A new mtime with the same content: hashed once more, then stamped again.
    shard = info.splits["train"].files[0]
    os.utime(shard, ns=(os.stat(shard).st_atime_ns, os.stat(shard).st_mtime_ns + 10**9))
    prepare(cfg)
    prepare(cfg)
    assert hashes[os.path.basename(shard)] == 3 and sum(hashes.values()) == 2 * len(hashes) + 1
    # The stamps are only a cache: a damaged sidecar means hashing again, not an error.
    with open(os.path.join(os.path.dirname(shard), shards.STAMPS), "w") as f:
        f.write("{not json")
    assert prepare(cfg) == info and sum(hashes.values()) == 3 * len(hashes) + 1


def test_same_size_damage_with_restored_mtime_needs_verify(digits):
    cfg, info = digits
    shard = info.splits["train"].files[1]
    before = os.stat(shard)
    with open(shard, "r+b") as f:  # one flipped bit in place, then the old mtime put back
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(before.st_size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert prepare(cfg) == info  # size and mtime match the stamp: the quick check cannot see it
    with pytest.raises(DataError) as err:
        prepare(dataclasses.replace(cfg, verify=True))
    assert shard in str(err.value) and "corrupted" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="corrupted"):  # once found, reported without verify too
        prepare(cfg)


def test_truncated_shard_is_caught_without_hashing(digits, hashes):
    cfg, info = digits
    shard = info.splits["validation"].files[3]
    before = os.stat(shard)
    with open(shard, "r+b") as f:
        f.truncate(before.st_size - 7)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(DataError, match=f"{os.path.basename(shard)} is truncated"):
        prepare(cfg)
    assert not hashes  # the size check alone names it


def test_missing_shard_is_named(digits):
    cfg, info = digits
    os.remove(info.splits["validation"].files[0])
    with pytest.raises(DataError, match="validation-00000-of-00004.tfrecord is missing"):
        prepare(cfg)


def test_shard_counts():
    assert shards.shard_sizes(10, 3) == [4, 3, 3]
    assert shards.num_shards_for(1000, 8) == 8
    assert shards.num_shards_for(100, 8) == 3  # at least 32 records per shard
    assert shards.num_shards_for(5, 8) == 1


def test_scan_finds_a_record_cut_in_the_middle(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(10):
            w.write(b"record %d" % i * 10)
    assert shards.scan_tfrecord(path) == 10
    record = os.path.getsize(path) // 10
    with open(path, "r+b") as f:  # keep 5 bytes of the last record: a cut in its 12-byte header
        f.truncate(9 * record + 5)
    # TensorFlow silently reads one record less ...
    assert sum(1 for _ in tf.data.TFRecordDataset(path)) == 9
    # ... the framing scan does not.
    with pytest.raises(DataError, match="truncated"):
        shards.scan_tfrecord(path)


def write_one_shard(out):
    entries = shards.write_split(out, "train", [b"a", b"b"], 2, 1)
    return {"splits": {"train": {"num_records": 2, "encoding": "raw", "shards": entries}}}


def test_materialize_is_atomic(tmp_path):
    target = str(tmp_path / "ds" / "shards1")
    os.makedirs(os.path.dirname(target))

    def crash(out):
        write_one_shard(out)
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        shards.materialize(target, crash, str(tmp_path / "ds" / ".lock"))
    assert os.listdir(tmp_path / "ds") == [".lock"]  # nothing that looks like a dataset
    os.makedirs(target + ".tmp-999-dead")  # debris of a builder that was kill -9'd
    manifest = shards.materialize(target, write_one_shard, str(tmp_path / "ds" / ".lock"))
    assert manifest["splits"]["train"]["num_records"] == 2
    assert sorted(os.listdir(tmp_path / "ds")) == [".lock", "shards1"]


def test_materialize_builds_once_under_concurrency(tmp_path):
    # flock locks belong to open file descriptions: threads contend like processes do.
    target = str(tmp_path / "ds" / "shards1")
    os.makedirs(os.path.dirname(target))
    builds, results = [], []

    def slow_build(out):
        builds.append(out)
        time.sleep(0.3)
        return write_one_shard(out)

    def worker():
        results.append(shards.materialize(target, slow_build, str(tmp_path / "ds" / ".lock")))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(results) == 3 and all(r == results[0] for r in results)


def test_dir_without_manifest_is_refused(tmp_path):
    target = tmp_path / "ds" / "shards1"
    target.mkdir(parents=True)
    with pytest.raises(DataError, match="has no manifest.json"):
        shards.materialize(str(target), write_one_shard, str(tmp_path / "ds" / ".lock"))


@pytest.mark.slow  # two fresh TensorFlow imports: about 12 s on 2 cores
def test_two_processes_prepare_the_same_dataset(tmp_path):
    # Two workers of a multi-worker job on one machine: one builds, the other waits and reuses.
    code = (
        "import sys; from tfopt.config import DataConfig; from tfopt.data import prepare; "
        "info = prepare(DataConfig(dataset='digits', data_dir=sys.argv[1], limit=100)); "
        "print(info.splits['train'].num_records)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert [o[0].strip() for o in outs] == ["100", "100"]
    assert sorted(os.listdir(tmp_path / "digits")) == [".lock", "shards8-limit100"]
    prepare(DataConfig(dataset="digits", data_dir=str(tmp_path), limit=100))  # verifies
