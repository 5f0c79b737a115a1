"""User TFRecord files: ``tfrecord:GLOB`` with ``data.feature_spec``.

The files are never rewritten: tfopt indexes them (record count, size, sha256 per file) in a
manifest under ``{data_dir}/tfrecord-<hash>/index`` and verifies it on every later use. With
``limit > 0`` the first ``limit`` records of each split are copied into tfopt shards instead.

``data.feature_spec`` names how the records are encoded, e.g. ``image=raw:28x28x1,label=int64,classes=10``
or ``image=png,label=int64``: each record is a ``tf.train.Example`` with an image bytes feature
(raw uint8 H x W x C, PNG or JPEG) and an int64 label. The features are called ``image`` and
``label`` unless ``image_key=`` / ``label_key=`` name others (e.g. the TF-Slim and Object Detection
API's ``image_key=image/encoded,label_key=image/class/label``); ``labels=PATH`` names a text file of
class names, one per line (label ``i`` is line ``i``). ``classes`` defaults to max label + 1 (or
the labels file's length); a PNG/JPEG image shape defaults to the shape of the first image, and
with ``data.image_size`` the images may have any sizes (the pipeline resizes them).

Split rule: a file belongs to the split named by a word of its base name (words split at any
non-alphanumeric character): ``train``/``training`` -> train, ``validation``/``valid``/``val``/``dev``
-> validation, ``test``/``testing`` -> test. Without validation files, the last ``n // 6`` (at least
one) of the train files become validation. Train and test files are required.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from tfopt.core._keras import tf

import numpy as np

from tfopt.config import DataConfig
from tfopt.core.errors import ConfigError, DataError
from tfopt.data import shards

ENCODINGS = ("raw", "png", "jpeg")
_EXAMPLE = (
    "image=raw:28x28x1,label=int64,classes=10 or image=jpeg,image_key=image/encoded,"
    "label_key=image/class/label,labels=labels.txt"
)
_KEYS = ("image", "label", "classes", "image_key", "label_key", "labels")
_SPLIT_WORDS = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
}


@dataclass(frozen=True)
class FeatureSpec:
    """How user records encode their features."""

    encoding: str  # raw | png | jpeg
    shape: tuple[int, int, int] | None  # None: taken from the first image (png/jpeg only)
    classes: int | None  # None: max label + 1
    image_key: str = "image"  # the image bytes feature's name
    label_key: str = "label"  # the int64 label feature's name
    labels: str = ""  # a text file of class names, one per line


def _spec_error(spec: str, problem: str) -> ConfigError:
    return ConfigError(f"data.feature_spec={spec!r}: {problem}; write it like {_EXAMPLE}")


def parse_feature_spec(spec: str) -> FeatureSpec:
    """Parses ``data.feature_spec`` strictly.

    Raises:
        ConfigError: one line naming the bad part, the valid choices and an example.
    """
    if not spec.strip():
        raise ConfigError(f"data.feature_spec is empty; tfrecord:GLOB needs it, e.g. {_EXAMPLE}")
    items: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key or not value:
            raise _spec_error(spec, f"{part.strip()!r} is not key=value")
        if key not in _KEYS:
            raise _spec_error(spec, f"unknown key {key!r} (valid keys: {', '.join(_KEYS)})")
        if key in items:
            raise _spec_error(spec, f"key {key!r} is given twice")
        items[key] = value
    if "image" not in items:
        raise _spec_error(spec, "the image encoding is missing")
    if items.get("label", "int64") != "int64":
        raise _spec_error(spec, f"label={items['label']!r} is not supported (valid: int64)")
    encoding, _, shape_text = (s.strip() for s in items["image"].partition(":"))
    if encoding not in ENCODINGS:
        raise _spec_error(spec, f"image encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
    shape = None
    if shape_text:
        dims = shape_text.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise _spec_error(
                spec, f"image shape {shape_text!r} is not HxWxC with positive integers"
            )
        shape = tuple(int(d) for d in dims)
        if encoding != "raw" and shape[2] not in (1, 3, 4):
            raise _spec_error(spec, f"{encoding} images have 1, 3 or 4 channels, not {shape[2]}")
    elif encoding == "raw":
        raise _spec_error(spec, "raw images need their shape, e.g. image=raw:28x28x1")
    classes = None
    if "classes" in items:
        if not items["classes"].isdigit() or int(items["classes"]) < 2:
            raise _spec_error(spec, f"classes={items['classes']!r} is not an integer >= 2")
        classes = int(items["classes"])
    return FeatureSpec(
        encoding,
        shape,
        classes,
        items.get("image_key", "image"),
        items.get("label_key", "label"),
        items.get("labels", ""),
    )


def read_labels(fs: FeatureSpec, spec: str) -> list[str]:
    """The class names of ``labels=PATH`` (one per non-empty line), or [] without it.

    Raises:
        ConfigError: the file cannot be read or holds fewer than two names.
    """
    if not fs.labels:
        return []
    try:
        with open(os.path.expanduser(fs.labels), encoding="utf-8") as f:
            names = [line.strip() for line in f if line.strip()]
    except OSError as e:
        raise _spec_error(
            spec, f"labels file {fs.labels!r} cannot be read ({e.strerror})"
        ) from None
    if len(names) < 2:
        raise _spec_error(
            spec, f"labels file {fs.labels!r} names {len(names)} class(es); give one name per line"
        )
    return names


def slug(pattern: str, spec: str) -> str:
    """Returns the cache directory name for a glob + feature spec + the files it matches now.

    A file that starts (or stops) matching the glob makes a new name, so the files are indexed
    again; a changed file is caught by the manifest's checksums.
    """
    where = pattern if "://" in pattern else os.path.abspath(pattern)
    matched = "\n".join(sorted(tf.io.gfile.glob(pattern)))
    return "tfrecord-" + hashlib.sha256(f"{where}|{spec}|{matched}".encode()).hexdigest()[:12]


def split_files(pattern: str) -> dict[str, list[str]]:
    """Finds the files of a glob and assigns them to splits by name (see the module's rule).

    Raises:
        DataError: no file matches, a name names no split or two, or train/test files are missing.
    """
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise DataError(f"tfrecord:{pattern} matches no file; check the glob pattern")
    out: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for path in files:
        words = {
            _SPLIT_WORDS[w]
            for w in re.split(r"[^a-z0-9]+", os.path.basename(path).lower())
            if w in _SPLIT_WORDS
        }
        if len(words) != 1:
            raise DataError(
                f"cannot tell the split of {path}: its name must contain exactly one of "
                "train, validation (or val/valid/dev) or test as a word; rename it"
            )
        out[words.pop()].append(path)
    for need in ("train", "test"):
        if not out[need]:
            raise DataError(
                f"tfrecord:{pattern} has no {need} file; add files named like "
                f"'{need}-00000.tfrecord'"
            )
    if not out["validation"]:
        if len(out["train"]) < 2:
            raise DataError(
                f"tfrecord:{pattern} has no validation file and only one train file; add "
                "a validation file or split train into several files"
            )
        cut = len(out["train"]) - max(1, len(out["train"]) // 6)
        out["train"], out["validation"] = out["train"][:cut], out["train"][cut:]
    return out


def _check_file(path: str, fs: FeatureSpec) -> tuple[int, int, int, tuple[int, ...]]:
    """Reads a user file fully: returns (records, min label, max label, shape of its first image)."""
    count = shards.scan_tfrecord(path)  # catches truncation, which TensorFlow does not
    spec = {fs.label_key: tf.io.FixedLenFeature([], tf.int64)}
    if fs.encoding == "raw":  # every raw image must have the spec's size, not only the first
        spec[fs.image_key] = tf.io.FixedLenFeature([], tf.string)
    lo, hi, shape = None, None, ()
    expected = int(np.prod(fs.shape)) if fs.encoding == "raw" and fs.shape else None

    def read(batch):
        parsed = tf.io.parse_example(batch, spec)
        sizes = (
            tf.strings.length(parsed[fs.image_key])
            if expected
            else tf.zeros_like(parsed[fs.label_key], tf.int32)
        )
        return parsed[fs.label_key], sizes

    try:
        ds = tf.data.TFRecordDataset(path).batch(4096)
        for i, (batch, sizes) in enumerate(ds.map(read).as_numpy_iterator()):
            if batch.size:
                lo = int(batch.min()) if lo is None else min(lo, int(batch.min()))
                hi = int(batch.max()) if hi is None else max(hi, int(batch.max()))
            wrong = np.nonzero(sizes != expected)[0] if expected else ()
            if len(wrong):
                raise DataError(
                    f"record {i * 4096 + int(wrong[0])} of {path} has a {int(sizes[wrong[0]])}-byte image, "
                    f"but data.feature_spec says raw {'x'.join(map(str, fs.shape))} ({expected} bytes); "
                    "give every image that shape, or fix the spec"
                )
        for record in tf.data.TFRecordDataset(path).take(1):
            image = tf.io.parse_single_example(
                record, {fs.image_key: tf.io.FixedLenFeature([], tf.string)}
            )[fs.image_key]
            if fs.encoding == "raw":
                shape = (int(tf.strings.length(image)),)
            else:
                shape = tuple(tf.io.decode_image(image, expand_animations=False).shape)
    except tf.errors.DataLossError as e:
        raise DataError(
            f"TFRecord file {path} is corrupted ({str(e).splitlines()[0]}); "
            "restore or regenerate it"
        ) from None
    except tf.errors.InvalidArgumentError as e:
        raise DataError(
            f"records of {path} do not match data.feature_spec (need a bytes {fs.image_key!r} "
            f"and an int64 {fs.label_key!r} feature; name others with image_key= / label_key=): "
            f"{str(e).splitlines()[0]}"
        ) from None
    if count and lo is None:
        lo = hi = 0
    return count, (lo if lo is not None else 0), (hi if hi is not None else -1), shape


def _checked_shape(path: str, fs, first, shape, varying: bool):
    """The image shape after reading ``path``, whose first record is ``first``; refuses a raw
    record of the wrong size, or (sizes not ``varying``) an image of another height and width."""
    if fs.encoding == "raw" and first and first[0] != int(np.prod(fs.shape)):
        raise DataError(
            f"images in {path} have {first[0]} bytes, but data.feature_spec says "
            f"raw {'x'.join(map(str, fs.shape))} ({int(np.prod(fs.shape))} bytes); fix the spec"
        )
    if fs.encoding != "raw" and first:
        shape = shape or first
        if not varying and tuple(first[:2]) != tuple(
            shape[:2]
        ):  # channels are converted when decoding
            raise DataError(
                f"the first image of {path} is {'x'.join(map(str, first))}, not "
                f"{'x'.join(map(str, shape))}; give every image one shape, or resize them "
                "with --image-size HxW"
            )
    return shape


def _classes(fs, names: list[str], lo: int, hi: int, pattern: str) -> int:
    """The number of classes, checked against the labels seen (``lo``..``hi``) and the names."""
    if lo < 0:
        raise DataError(
            f"tfrecord:{pattern} has negative labels ({lo}); labels must be 0..classes-1"
        )
    classes = fs.classes or max(hi + 1, len(names))
    if names and len(names) != classes:
        raise DataError(
            f"labels file {fs.labels!r} names {len(names)} classes but the data has {classes}; "
            "give one name per class"
        )
    if hi >= classes:
        raise DataError(
            f"tfrecord:{pattern} has label {hi} but data.feature_spec says classes={classes}; "
            f"set classes to at least {hi + 1}"
        )
    return classes


def build_tfrecord(out_dir: str, cfg: DataConfig, pattern: str) -> dict:
    """Indexes (``limit == 0``) or copies the first ``limit`` records of (``limit > 0``) user files.

    Returns:
        The manifest (without its ``format`` key); shard ``file`` entries are absolute paths of the
        user files when indexing.

    Raises:
        ConfigError: a bad ``data.feature_spec``.
        DataError: unusable files (see ``split_files``), corrupted or truncated files, records
            that do not match the spec, or labels outside ``[0, classes)``.
    """
    fs = parse_feature_spec(cfg.feature_spec)
    names = read_labels(fs, cfg.feature_spec)
    varying = bool(cfg.image_size) and fs.encoding != "raw"  # any sizes: the pipeline resizes them
    splits: dict[str, dict] = {}
    shape, lo, hi = fs.shape, 0, -1
    for split, files in split_files(pattern).items():
        entries = []
        for path in files:
            count, f_lo, f_hi, first = _check_file(path, fs)
            lo, hi = min(lo, f_lo), max(hi, f_hi)
            shape = _checked_shape(path, fs, first, shape, varying)
            entries.append(
                {
                    "file": path,
                    "records": count,
                    "bytes": shards.file_size(path),
                    "sha256": shards.sha256_file(path),
                }
            )
        splits[split] = {
            "num_records": sum(e["records"] for e in entries),
            "encoding": fs.encoding,
            "shards": entries,
        }
    classes = _classes(fs, names, lo, hi, pattern)
    if shape is None:
        raise DataError(f"tfrecord:{pattern} holds no records; give files with data")
    if cfg.limit > 0:
        for split, info in splits.items():
            n = min(cfg.limit, info["num_records"])
            files = [e["file"] for e in info["shards"]]
            records = tf.data.TFRecordDataset(files).take(n).as_numpy_iterator()
            info.update(
                num_records=n, shards=shards.write_split(out_dir, split, records, n, cfg.num_shards)
            )
    if varying:
        shape = (None, None, shape[2] if len(shape) == 3 else 3)
    return {
        "description": f"user TFRecord files {pattern} ({cfg.feature_spec})",
        "image_shape": list(shape),
        "num_classes": int(classes),
        "encoding": fs.encoding,
        "splits": splits,
        "class_names": names,
        "feature_keys": [fs.image_key, fs.label_key],
    }
