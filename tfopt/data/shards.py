"""TFRecord shards on disk: writing them, their manifest, its verification, and safe building.

A dataset directory holds ``{split}-{i:05d}-of-{n:05d}.tfrecord`` shards and a ``manifest.json``
that records, per shard, the record count, byte size and sha256. The manifest is checked on every
use, because TensorFlow itself does not notice everything: a TFRecord cut in the middle of a record
silently loses the rest of it, and ``ignore_errors()`` silently drops the rest of a damaged shard.

Hashing every shard on every use is too slow for a large dataset, so a shard is hashed in full once
and then stamped in ``verified.json`` (its size and mtime when it was found intact); later checks
compare only size and mtime, like make or rsync's quick check. A changed stamp, or ``full=True``,
hashes the shard again. A flipped bit that leaves size and mtime alone (bit rot, a restored mtime)
is therefore caught only by a full check (``data.verify``).

Directories are built in a temporary sibling and renamed into place (so a crash never leaves a
half-built dataset that looks complete), under an ``fcntl`` lock so that several processes on one
machine (e.g. the workers of a multi-worker job) never build the same directory at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator

from tfopt.core._keras import tf

import numpy as np

from tfopt.core.errors import DataError
from tfopt.core.fileio import write_bytes

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STAMPS = (
    "verified.json"  # sidecar of MANIFEST: {shard file: stamp of when it was last hashed intact}
)
FORMAT_VERSION = 1
# A split gets fewer shards than asked when it is small: at least this many records per shard.
MIN_RECORDS_PER_SHARD = 32
_HASH_CHUNK = 1 << 20


def sha256_file(path: str) -> str:
    """Returns the hex sha256 of a file (local or any filesystem ``tf.io.gfile`` reads)."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_size(path: str) -> int:
    """Returns the size of a file in bytes (local or any filesystem ``tf.io.gfile`` reads)."""
    return tf.io.gfile.stat(path).length


def file_stat(path: str) -> tuple[int, int]:
    """Returns ``(size in bytes, mtime in ns)`` of a file (local or any ``tf.io.gfile`` filesystem)."""
    if "://" not in path:  # gfile's stat of a local file has whole seconds only: too coarse a stamp
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    st = tf.io.gfile.stat(path)
    return st.length, st.mtime_nsec


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Holds an exclusive ``fcntl`` lock on ``path`` (created if missing) for the block."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def num_shards_for(num_records: int, requested: int) -> int:
    """Returns how many shards a split of ``num_records`` gets: ``requested``, fewer if it is tiny."""
    return max(1, min(requested, num_records // MIN_RECORDS_PER_SHARD))


def shard_sizes(num_records: int, num_shards: int) -> list[int]:
    """Splits ``num_records`` into ``num_shards`` contiguous chunks whose sizes differ by at most 1."""
    base, extra = divmod(num_records, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


def shard_name(split: str, index: int, count: int) -> str:
    """Returns the file name of shard ``index`` of ``count`` of a split."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def encode_example(image: bytes, label: int) -> bytes:
    """Serializes one ``tf.train.Example`` with ``image`` (bytes) and ``label`` (int64)."""
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_split(
    out_dir: str, split: str, records: Iterable[bytes], num_records: int, num_shards: int
) -> list[dict]:
    """Writes serialized records into contiguous shards and describes them for the manifest.

    Contiguous chunks keep "the first N records" meaning the same at any shard count.

    Args:
        out_dir: Directory to write into.
        split: Split name used in the shard file names.
        records: Exactly ``num_records`` serialized records, in order.
        num_records: How many records ``records`` yields.
        num_shards: Shards wanted (fewer for a tiny split, see ``num_shards_for``).

    Returns:
        One manifest entry per shard: ``{"file", "records", "bytes", "sha256"}``.

    Raises:
        DataError: ``records`` yields fewer or more records than ``num_records``.
    """
    count = num_shards_for(num_records, num_shards)
    iterator = iter(records)
    entries = []
    for index, size in enumerate(shard_sizes(num_records, count)):
        name = shard_name(split, index, count)
        path = os.path.join(out_dir, name)
        written = 0
        with tf.io.TFRecordWriter(path) as writer:
            for record in iterator:
                writer.write(record)
                written += 1
                if written == size:
                    break
        if written != size:
            raise DataError(
                f"split {split!r} ended after {sum(e['records'] for e in entries) + written} "
                f"of {num_records} expected records; the source is incomplete"
            )
        entries.append(
            {
                "file": name,
                "records": size,
                "bytes": os.path.getsize(path),
                "sha256": sha256_file(path),
            }
        )
    if next(iterator, None) is not None:
        raise DataError(f"split {split!r} has more than the {num_records} expected records")
    return entries


def write_image_split(
    out_dir: str, split: str, images: np.ndarray, labels: np.ndarray, num_shards: int
) -> dict:
    """Writes uint8 images ``[N, H, W, C]`` and int labels ``[N]`` as raw-encoded shards.

    Returns:
        The split's manifest entry: ``{"num_records", "encoding": "raw", "shards": [...]}``.
    """
    images = np.ascontiguousarray(images, dtype=np.uint8)
    records = (encode_example(img.tobytes(), lab) for img, lab in zip(images, labels))
    shards = write_split(out_dir, split, records, len(images), num_shards)
    return {"num_records": int(len(images)), "encoding": "raw", "shards": shards}


def scan_tfrecord(path: str) -> int:
    """Counts the records of a TFRecord file from its framing, refusing a truncated file.

    TensorFlow's reader stops silently at a record cut in the middle; walking the length
    headers finds that cut. CRCs are not checked here (TensorFlow checks them when reading).

    Raises:
        DataError: the file cannot be read or ends in the middle of a record.
    """
    size = file_size(path)
    count, offset = 0, 0
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            while offset < size:
                header = f.read(12)
                if len(header) < 12:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                end = offset + 12 + length + 4
                if end > size:
                    break
                f.seek(end)
                offset, count = end, count + 1
    except (OSError, tf.errors.OpError) as e:
        raise DataError(f"cannot read TFRecord file {path}: {str(e).splitlines()[0]}") from None
    if offset != size:
        raise DataError(
            f"TFRecord file {path} is truncated: it ends in the middle of record "
            f"{count + 1} (byte {offset} of {size}); restore or regenerate the file"
        )
    return count


def read_manifest(directory: str) -> dict | None:
    """Returns the parsed ``manifest.json`` of ``directory``, or None when there is none.

    Raises:
        DataError: the manifest exists but is not valid JSON of the expected format.
    """
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(
            f"manifest {path} is unreadable ({str(e).splitlines()[0]}); "
            f"delete {directory} to rebuild it"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise DataError(
            f"manifest {path} is not a tfopt format-{FORMAT_VERSION} manifest; "
            f"delete {directory} to rebuild it"
        )
    problem = _schema_problem(manifest)
    if problem:
        raise DataError(f"manifest {path} is damaged ({problem}); delete {directory} to rebuild it")
    return manifest


_SHARD_FIELDS = {"file": str, "bytes": int, "records": int, "sha256": str}


def _schema_problem(manifest: dict) -> str | None:
    """What is missing or mistyped in a manifest's fields that tfopt reads (None when nothing is)."""
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not splits:
        return "no splits"
    for split, info in splits.items():
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("num_records"), int)
            or not isinstance(info.get("shards"), list)
        ):
            return f"split {split!r} lacks num_records or shards"
        for i, entry in enumerate(info["shards"]):
            for key, typ in _SHARD_FIELDS.items():
                if (
                    not isinstance(entry, dict)
                    or not isinstance(entry.get(key), typ)
                    or isinstance(entry.get(key), bool)
                ):
                    return f"shard {i} of split {split!r} has no valid {key!r}"
    return None


def write_manifest(directory: str, manifest: dict) -> None:
    """Writes ``manifest.json`` into ``directory`` atomically."""
    manifest = dict(manifest, format=FORMAT_VERSION)
    write_bytes(
        os.path.join(directory, MANIFEST),
        json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"),
    )


def shard_path(directory: str, entry: dict) -> str:
    """Returns the path of a manifest shard entry (its file is relative to ``directory`` or absolute)."""
    return os.path.join(directory, entry["file"])


def read_stamps(directory: str) -> dict:
    """Returns the shard stamps recorded in ``directory`` (``{}`` when none are usable).

    The stamps only spare work: a missing or unreadable sidecar means "hash everything again",
    never an error.
    """
    try:
        with open(os.path.join(directory, STAMPS), encoding="utf-8") as f:
            stamps = json.load(f)
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def write_stamps(directory: str, stamps: dict) -> None:
    """Writes the shard stamps sidecar atomically; on a read-only directory, logs and goes on."""
    try:
        write_bytes(
            os.path.join(directory, STAMPS), json.dumps(stamps, indent=1, sort_keys=True).encode()
        )
    except OSError as e:  # e.g. a dataset prepared by someone else: we just hash again next time
        log.warning(
            "cannot record verified shards in %s (%s); every use will hash them again", directory, e
        )


def _stamp(size: int, mtime_ns: int, entry: dict) -> dict:
    # The manifest's hash is part of the stamp: a stamp vouches for that content only.
    return {"bytes": size, "mtime_ns": mtime_ns, "sha256": entry["sha256"]}


def stamp_built(directory: str, manifest: dict) -> dict:
    """Returns stamps for the shards a build just wrote (and hashed) into ``directory``.

    Only files inside ``directory`` are stamped: nobody else can have changed them since their
    hash was taken. Shards given by absolute path (user files) are hashed again on first use.
    """
    stamps = {}
    for info in manifest.get("splits", {}).values():
        for entry in info.get("shards", []):
            if not os.path.isabs(entry["file"]):
                size, mtime_ns = file_stat(shard_path(directory, entry))
                if size == entry["bytes"]:
                    stamps[entry["file"]] = _stamp(size, mtime_ns, entry)
    return stamps


def verify_manifest(
    directory: str, manifest: dict, fix: str | None = None, *, full: bool = False
) -> None:
    """Checks every shard of a manifest: present, right byte size, right sha256.

    The size is checked on every call. The sha256 is computed only for a shard whose size or
    mtime differ from its stamp in ``verified.json`` (or that has none), or for all when ``full``;
    shards found intact get a fresh stamp.

    Args:
        directory: The dataset directory holding the manifest.
        manifest: Its parsed content.
        fix: What to tell the user to do; defaults to deleting ``directory`` to rebuild it.
        full: Hash every shard, whatever its stamp says (catches same-size, same-mtime damage).

    Raises:
        DataError: naming the first shard that is missing, truncated or corrupted, and the fix.
    """
    fix = fix or f"delete {directory} to rebuild it"
    recorded = read_stamps(directory)
    trusted = {} if full else recorded
    stamps = {}
    for split, info in sorted(manifest.get("splits", {}).items()):
        shards = info.get("shards", [])
        if sum(s["records"] for s in shards) != info.get("num_records"):
            raise DataError(
                f"manifest {os.path.join(directory, MANIFEST)} is inconsistent for split "
                f"{split!r}; {fix}"
            )
        for entry in shards:
            path = shard_path(directory, entry)
            if not tf.io.gfile.exists(path):
                raise DataError(f"shard {path} is missing; {fix}")
            # Stat before hashing: a change during the hash then leaves a stale stamp, which makes
            # the next call hash again, never a stamp that vouches for unseen content.
            size, mtime_ns = file_stat(path)
            if size != entry["bytes"]:
                what = "truncated" if size < entry["bytes"] else "longer than recorded"
                raise DataError(
                    f"shard {path} is {what}: {size} bytes, the manifest says "
                    f"{entry['bytes']}; {fix}"
                )
            stamp = _stamp(size, mtime_ns, entry)
            if trusted.get(entry["file"]) != stamp and sha256_file(path) != entry["sha256"]:
                if (
                    recorded.pop(entry["file"], None) is not None
                ):  # keep failing without a full check
                    write_stamps(directory, recorded)
                raise DataError(
                    f"shard {path} is corrupted: its sha256 does not match the manifest; {fix}"
                )
            stamps[entry["file"]] = stamp
    if stamps != recorded:
        write_stamps(directory, stamps)


def materialize(target: str, build: Callable[[str], dict], lock_path: str) -> dict:
    """Builds ``target`` once: in a temp sibling under a file lock, then renamed into place.

    Args:
        target: The dataset directory to create.
        build: Writes the shards into the directory it is given and returns the manifest.
        lock_path: Lock file serializing builders (processes of one machine).

    Returns:
        The manifest of ``target`` (built now, or by a concurrent builder that won the lock).
    """
    with file_lock(lock_path):
        manifest = read_manifest(target)
        if manifest is not None:
            return manifest
        if os.path.exists(target):
            raise DataError(f"{target} exists but has no {MANIFEST}; delete {target} to rebuild it")
        parent = os.path.dirname(target)
        stem = os.path.basename(target) + ".tmp-"
        for leftover in os.listdir(parent):  # a crashed builder's debris; we hold the lock
            if leftover.startswith(stem):
                shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
        tmp = os.path.join(parent, f"{stem}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.makedirs(tmp)
        try:
            manifest = build(tmp)
            write_manifest(tmp, manifest)
            # The build hashed every shard it wrote: stamp them now rather than hash them again.
            write_stamps(tmp, stamp_built(tmp, manifest))
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return read_manifest(target)
