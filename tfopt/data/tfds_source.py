"""TensorFlow Datasets sources: ``tfds:NAME[/CONFIG]`` and ``fashion_mnist``.

tfds prepares the dataset (download + generation) under ``{data_dir}/tfds``; tfopt then reads the
image/label features and writes its own raw shards. Without internet, tfds can only prepare data
that is already local. For Fashion-MNIST, the Debian package ``dataset-fashion-mnist`` provides
the four upstream files: Debian stripped the file name and time from their gzip headers, which
breaks tfds's checksums although the compressed data is intact. Putting the original header back
reproduces the upstream files byte for byte, and tfds verifies them against its own registered
sha256 when it reads them from its manual directory.

With ``limit > 0``, tfds generates only as many records per split as the limit needs
(``max_examples_per_split``, under ``{data_dir}/tfds/limit{N}``), so a smoke run does not generate
the whole dataset; those records are the first tfds generates, not the first of the full splits.
Offline, a tfds download of data that is not local fails only after tfds's retries (minutes).
"""

from __future__ import annotations

import logging
import os
import re
import struct

from tfopt.core._keras import tf

import numpy as np

from tfopt.config import DataConfig
from tfopt.core.errors import DataError
from tfopt.core.fileio import write_bytes
from tfopt.data import shards
from tfopt.data.builtin import SPLITS, plan_splits, records_needed

log = logging.getLogger(__name__)

DEBIAN_FASHION_DIR = "/usr/share/datasets/fashion-mnist"
DEBIAN_FASHION_PACKAGE = "dataset-fashion-mnist"
# gzip mtimes of the upstream Fashion-MNIST release files (Aug 2017), found by matching the sha256
# values tfds registers for them.
_FASHION_MTIMES = {
    "train-images-idx3-ubyte.gz": 1504176606,
    "train-labels-idx1-ubyte.gz": 1504176606,
    "t10k-images-idx3-ubyte.gz": 1504176627,
    "t10k-labels-idx1-ubyte.gz": 1504176627,
}
_READ_BATCH = 1024


def _deflate_offset(data: bytes, path: str) -> int:
    """Returns where the deflate stream of a gzip member starts (after its header)."""
    if data[:3] != b"\x1f\x8b\x08":
        raise DataError(f"{path} is not a gzip file; reinstall {DEBIAN_FASHION_PACKAGE}")
    flags, pos = data[3], 10
    if flags & 4:  # FEXTRA
        pos += 2 + struct.unpack("<H", data[pos : pos + 2])[0]
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            pos = data.index(b"\0", pos) + 1
    if flags & 2:  # FHCRC
        pos += 2
    return pos


def restore_fashion_mnist(debian_dir: str, manual_dir: str) -> bool:
    """Writes the upstream Fashion-MNIST .gz files into ``manual_dir`` from the Debian copies.

    Returns:
        True when all four files are (now) in ``manual_dir``; False when the Debian files are absent.
    """
    if not all(os.path.isfile(os.path.join(debian_dir, n)) for n in _FASHION_MTIMES):
        return False
    os.makedirs(manual_dir, exist_ok=True)
    for name, mtime in _FASHION_MTIMES.items():
        target = os.path.join(manual_dir, name)
        if os.path.isfile(target):
            continue
        src = os.path.join(debian_dir, name)
        with open(src, "rb") as f:
            data = f.read()
        header = (
            b"\x1f\x8b\x08\x08"
            + struct.pack("<I", mtime)
            + b"\x00\x03"
            + name[:-3].encode()
            + b"\0"
        )
        write_bytes(target, header + data[_deflate_offset(data, src) :])
    return True


def parse_tfds_name(spec: str) -> str:
    """Validates the NAME[/CONFIG][:VERSION] part of a ``tfds:`` dataset string."""
    name = spec.strip()
    if not name or any(c.isspace() for c in name):
        raise DataError(
            f"dataset 'tfds:{spec}' has no valid tfds name; use tfds:NAME or tfds:NAME/CONFIG "
            "(e.g. tfds:fashion_mnist)"
        )
    return name


# tfds failures a user can fix become one-line DataErrors; everything else (a bug of ours or of
# tfds, MemoryError, KeyboardInterrupt, ...) propagates with its traceback, which a one-line
# message would hide. Messages are matched only where tfds has no exception type of its own: if
# tfds rewords one, the error propagates with its traceback, never gets a wrong explanation.
_BAD_NAME_MESSAGES = (
    (ValueError, "BuilderConfig"),  # tfds:NAME/NO_SUCH_CONFIG
    (ValueError, "Parsing builder name string"),  # tfds:NAME/ or other malformed strings
    (AssertionError, "cannot be loaded at version"),  # tfds:NAME:NO_SUCH_VERSION
)


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


def _missing_module(e: BaseException | None) -> str | None:
    """Returns the third-party module whose absence raised ``e``, if that is what happened."""
    while (
        e is not None
    ):  # tfds re-raises ImportErrors as a new one (without .name) from the original
        if isinstance(e, ModuleNotFoundError) and e.name:
            return None if e.name.split(".")[0] == "tfopt" else e.name  # ours missing: a bug
        e = e.__cause__
    return None


def _builder(name: str, data_dir: str | None):
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.DatasetNotFoundError as e:
        raise DataError(
            f"tfds has no dataset {name!r} ({_first_line(e)}); check the name with "
            "tfds.list_builders() or use one of tfopt's sources"
        ) from None
    except (ValueError, AssertionError) as e:
        if not any(isinstance(e, kind) and text in str(e) for kind, text in _BAD_NAME_MESSAGES):
            raise
        # Drop tfds's 'Failed to construct dataset "X", builder_kwargs "{...}": ' prefix.
        # (The prefix holds data_dir, of any length: it goes before the line is shortened.)
        why = re.sub(
            r'^Failed to construct dataset "[^"]*", builder_kwargs "[^"]*": ',
            "",
            _first_line(e, limit=100_000),
        )[:200]
        raise DataError(
            f"tfds cannot build dataset {name!r} ({why.split('. ')[0].rstrip('.')}); "
            "use tfds:NAME[/CONFIG][:VERSION] with a config and version tfds has"
        ) from None
    except ImportError as e:
        module = _missing_module(e)
        if module is None:
            raise
        raise DataError(
            f"tfds dataset {name!r} needs the Python module {module!r}; install it "
            f"(pip install {module.split('.')[0]})"
        ) from None


def _prepare_failure(e: Exception) -> str | None:
    """Returns why tfds could not prepare a dataset when it is a cause a user can fix, else None."""
    import tensorflow_datasets as tfds

    if type(e) is RuntimeError and e.__cause__ is not None:  # tfds's re-raise wrapper
        e = e.__cause__
    if isinstance(e, tfds.download.DownloadError):
        return "a download failed"
    # Not exported by tfds's public API: matched by name rather than imported from a private module.
    if any(c.__name__ == "NonMatchingChecksumError" for c in type(e).__mro__):
        return "a downloaded or manual file does not have the checksum tfds expects"
    if isinstance(e, AssertionError) and "Manual directory" in str(e):
        return "files it needs are not in its manual directory"
    if isinstance(e, OSError):  # unreadable files, a full disk, no network (requests/urllib errors)
        return "a file could not be fetched, read or written"
    if isinstance(e, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError)):
        return "a file could not be read"
    module = _missing_module(e)
    if module is not None:
        return f"it needs the Python module {module!r} (pip install {module.split('.')[0]})"
    return None


def _features(builder, name: str) -> tuple[str, str, tuple, int, list[str]]:
    """Finds the image and label features: (image key, label key, image shape (H, W None when the
    sizes vary), num classes, class names)."""
    import tensorflow_datasets as tfds

    keys = builder.info.supervised_keys
    if not (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys)):
        keys = ("image", "label")
    features = builder.info.features
    image_key, label_key = keys
    image = features[image_key] if image_key in features else None
    label = features[label_key] if label_key in features else None
    if not isinstance(image, tfds.features.Image) or not isinstance(
        label, tfds.features.ClassLabel
    ):
        raise DataError(
            f"tfds dataset {name!r} has no (Image, ClassLabel) feature pair "
            f"(features: {', '.join(features)}); tfopt reads image classification datasets"
        )
    shape = tuple(image.shape)
    if len(shape) != 3 or shape[2] is None:
        raise DataError(
            f"tfds dataset {name!r} has images of shape {shape}; tfopt reads H x W x C images with a "
            "known channel count"
        )
    return image_key, label_key, shape, label.num_classes, list(label.names)


def _tfds_builder(name: str, cfg: DataConfig, offline_fashion: bool):
    """Returns a prepared tfds builder for ``name`` (preparing it if needed)."""
    import tensorflow_datasets as tfds

    base = _builder(name, os.path.join(cfg.data_dir, "tfds"))
    has = {s for s in base.info.splits.keys() if s in SPLITS} or {"train", "test"}
    if cfg.limit > 0:  # for smoke runs, let tfds generate only what the limit needs
        per_split = records_needed(cfg.limit, has)
        root = os.path.join(cfg.data_dir, "tfds", f"limit{per_split}")
    else:
        per_split, root = None, os.path.join(cfg.data_dir, "tfds", "full")
        default = _builder(name, None)
        if default.is_prepared():  # already prepared in the user's tfds data dir
            return default
    builder = _builder(name, root)
    if builder.is_prepared():
        return builder
    download_dir = os.path.join(cfg.data_dir, "tfds", "downloads")
    config = tfds.download.DownloadConfig(max_examples_per_split=per_split)
    base_name = name.split("/")[0].split(":")[0]
    if base_name == "fashion_mnist" and offline_fashion:
        manual = os.path.join(download_dir, "manual", "fashion_mnist")
        if restore_fashion_mnist(DEBIAN_FASHION_DIR, manual):
            config = config.replace(manual_dir=manual, try_download_gcs=False)
    with shards.file_lock(os.path.join(cfg.data_dir, "tfds", ".lock")):
        if builder.is_prepared():
            return builder
        log.info(
            "tfds is preparing %s (offline, a download fails only after minutes of retries)", name
        )
        import tensorflow_datasets as tfds

        # tfds draws tqdm bars of its own on stderr; tfopt's line above says what happens.
        tfds.display_progress_bar(logging.getLogger("tfopt").isEnabledFor(logging.DEBUG))
        try:
            builder.download_and_prepare(download_dir=download_dir, download_config=config)
        except Exception as e:  # narrowed at once: only the causes _prepare_failure knows
            why = _prepare_failure(e)
            if why is None:
                raise
            hint = (
                f"install the Debian package {DEBIAN_FASHION_PACKAGE} "
                f"(apt-get install -y {DEBIAN_FASHION_PACKAGE})"
                if base_name == "fashion_mnist"
                else f"put the prepared data under {root} or the files in {download_dir}/manual"
            )
            raise DataError(
                f"tfds could not prepare {name!r}: {why} ({type(e).__name__}: {_first_line(e)}); "
                f"without internet it needs the data locally: {hint}"
            ) from None
    return builder


def _encoded_records(
    builder,
    split: str,
    start: int,
    stop: int,
    image_key: str,
    label_key: str,
    varying: bool = False,
):
    """Yields serialized tfopt Examples for records [start, stop) of a tfds split: raw pixels, or
    PNG when the images' sizes vary (the pipeline resizes them to ``data.image_size``)."""
    ds = builder.as_dataset(split=f"{split}[{start}:{stop}]", shuffle_files=False)
    if varying:
        ds = ds.map(lambda ex: (tf.io.encode_png(ex[image_key]), ex[label_key])).prefetch(2)
        for png, label in ds.as_numpy_iterator():
            yield shards.encode_example(png, label)
        return
    ds = ds.map(lambda ex: (ex[image_key], ex[label_key])).batch(_READ_BATCH).prefetch(2)
    for images, labels in ds.as_numpy_iterator():
        for image, label in zip(np.ascontiguousarray(images, dtype=np.uint8), labels):
            yield shards.encode_example(image.tobytes(), label)


def build_tfds(out_dir: str, cfg: DataConfig, name: str, offline_fashion: bool = True) -> dict:
    """Prepares a tfds image classification dataset and writes it as raw tfopt shards.

    Args:
        out_dir: Directory to write the shards into.
        cfg: Supplies ``data_dir``, ``limit`` and ``num_shards``.
        name: tfds name, ``NAME[/CONFIG][:VERSION]``.
        offline_fashion: Feed tfds the Debian Fashion-MNIST files when they are installed.

    Returns:
        The manifest (without its ``format`` key).

    Raises:
        DataError: unknown name, not an image classification dataset, or tfds cannot prepare it.
    """
    builder = _tfds_builder(name, cfg, offline_fashion)
    image_key, label_key, shape, num_classes, names = _features(builder, name)
    varying = None in shape[:2]
    encoding = "image" if varying else "raw"
    sizes = {
        s: builder.info.splits[s].num_examples for s in builder.info.splits.keys() if s in SPLITS
    }
    splits = {}
    for split, (src, start, stop) in plan_splits(sizes, cfg.limit).items():
        records = _encoded_records(builder, src, start, stop, image_key, label_key, varying)
        entries = shards.write_split(out_dir, split, records, stop - start, cfg.num_shards)
        splits[split] = {"num_records": stop - start, "encoding": encoding, "shards": entries}
    return {
        "description": f"tfds {builder.info.full_name} (features {image_key!r}, {label_key!r})",
        "image_shape": list(shape),
        "num_classes": int(num_classes),
        "class_names": names,
        "encoding": encoding,
        "splits": splits,
    }
