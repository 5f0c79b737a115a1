"""A folder of images, one subfolder per class: ``folder:PATH``.

The layout Keras's ``image_dataset_from_directory`` reads::

    PATH/cats/001.jpg  PATH/cats/002.png  PATH/dogs/...          (split by fractions)
    PATH/train/cats/...  PATH/val/cats/...  PATH/test/cats/...   (split by folders)

Class names are the subfolder names, sorted; label ``i`` is the ``i``-th name. Image files are
those ending in .jpg, .jpeg, .png, .bmp or .gif (any case); other files and hidden entries are
passed over, as Keras does. With ``train/`` (and optionally ``val/`` or ``validation/``,
``test/``) subfolders those are the splits; a missing validation or test split is carved from
train like the other sources'. Otherwise every class is shuffled with ``data.seed`` and split
80/10/10 (each class keeps at least one image in each split).

Every image is decoded once while the shards are written: an empty or unreadable file stops the
build with a one-line error naming it (nothing is skipped silently). The shards hold the files'
own bytes (``encoding: image``, decoded by ``tf.io.decode_image``) in a seeded order that mixes
the classes, so that workers reading whole shards see every class. The directory name under
``data_dir`` includes a digest of the listing of exactly the images training reads (symlinked
class folders followed; names, sizes, modification times): adding, removing or editing an image
builds the shards anew. A link that leads nowhere or in a loop is skipped with one line each; an
unreadable image, a name that is not UTF-8 or a class name with a control character is refused
in one line.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import unicodedata

from tfopt.core._keras import tf

import numpy as np

from tfopt.config import DataConfig
from tfopt.core.errors import DataError
from tfopt.data import shards
from tfopt.data.builtin import plan_splits

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
SPLIT_FOLDERS = {
    "train": ("train",),
    "validation": ("val", "validation", "valid"),
    "test": ("test",),
}
FRACTIONS = {"validation": 0.1, "test": 0.1}
# What a labels-file line cannot hold: control characters, surrogates, line and paragraph separators.
_NOT_IN_A_LINE = {"Cc", "Cs", "Zl", "Zp"}
log = logging.getLogger(__name__)


def _visible(entries) -> list:
    return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)


def _scan(path: str) -> list:
    try:
        with os.scandir(path) as it:
            return _visible(it)
    except OSError as e:
        raise DataError(
            f"folder {path!r} cannot be listed ({e.strerror or e}); fix its permissions or remove it"
        ) from None


def _utf8(path: str) -> str:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"{os.fsencode(path)!r} is not a UTF-8 name, which TensorFlow cannot open; rename it"
        ) from None
    return path


def _class_files(root: str) -> dict[str, list[str]]:
    """``{class name: [image paths, sorted]}`` of one folder of class subfolders.

    Symlinked class folders and images are followed, as training reads them. A link that leads
    nowhere or in a loop is skipped with one warning line each; an entry that cannot be read is
    refused in one line.
    """
    classes = []
    for e in _scan(root):
        try:
            if e.is_dir():
                classes.append(e)
        except OSError:  # a link loop
            log.warning("skipped %r: a symbolic link loop", _utf8(e.path))
    out = {}
    for c in classes:
        files = []
        for e in _scan(_utf8(c.path)):
            if not e.name.lower().endswith(IMAGE_SUFFIXES):
                continue
            try:
                is_file = e.is_file()
            except OSError as err:
                log.warning("skipped %r: %s", _utf8(e.path), err.strerror or err)
                continue
            if is_file:
                files.append(_utf8(e.path))
            elif e.is_symlink():
                log.warning("skipped %r: a symbolic link that leads nowhere", _utf8(e.path))
        out[c.name] = files
    return out


def _split_folders(root: str) -> dict[str, str]:
    found = {}
    for split, names in SPLIT_FOLDERS.items():
        for name in names:
            if os.path.isdir(os.path.join(root, name)):
                found[split] = os.path.join(root, name)
                break
    return found


def check_root(root: str) -> str:
    """The absolute folder of ``folder:PATH``.

    Raises:
        DataError: PATH is empty or not a directory.
    """
    if not root.strip():
        raise DataError(
            "dataset 'folder:' has no path; use folder:/path/to/images (one subfolder per class)"
        )
    path = os.path.abspath(os.path.expanduser(root))
    if not os.path.isdir(path):
        raise DataError(
            f"dataset folder {root!r} is not a directory; give folder:PATH with one subfolder per class"
        )
    return path


def _listing(root: str) -> list[tuple[str, str]]:
    """``(split or "", class, path)`` of every image training reads, in a fixed order."""
    folders = _split_folders(root) or {"": root}
    return [
        (split, name, path)
        for split, folder in sorted(folders.items())
        for name, files in sorted(_class_files(folder).items())
        for path in files
    ]


def listing_digest(root: str) -> str:
    """A digest of exactly the images training reads (through symlinked folders too): each one's
    split, class, file name, size and modification time.

    Raises:
        DataError: an image cannot be read (its permissions), or a name is not UTF-8.
    """
    h = hashlib.sha256()
    for split, name, path in _listing(root):
        try:
            st = os.stat(path)
        except OSError as e:
            raise DataError(
                f"image {path!r} cannot be read ({e.strerror or e}); fix it or remove it"
            ) from None
        if not os.access(path, os.R_OK):
            raise DataError(f"image {path!r} cannot be read (permission denied); fix or remove it")
        entry = f"{split}/{name}/{os.path.basename(path)}\0{st.st_size}\0{st.st_mtime_ns}\n"
        h.update(entry.encode())
    return h.hexdigest()[:12]


def slug(root: str) -> str:
    """The source's directory name under ``data_dir``: the folder's name and the listing's digest."""
    path = check_root(root)
    name = (
        re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(path.rstrip(os.sep))).strip("-") or "root"
    )
    return f"folder-{name}-{listing_digest(path)}"


def line_breaker(name: str) -> str | None:
    """The first character of ``name`` that cannot be inside one line of a labels file.

    Control characters, surrogates and the Unicode line and paragraph separators (a reader
    splitting on any of them would shift every later label by one).
    """
    return next((c for c in name if unicodedata.category(c) in _NOT_IN_A_LINE), None)


def _check_classes(per_split: dict[str, dict[str, list[str]]], root: str) -> list[str]:
    names = sorted(per_split["train"])
    for name in names:  # a class name is one line of the exported labels file
        bad = line_breaker(name)
        if bad is not None:
            raise DataError(
                f"class folder {os.path.join(root, name)[:200]!r} has the control character "
                f"{bad!r} in its name; class names become label lines: rename the folder"
            )
    if len(names) < 2:
        raise DataError(
            f"folder {root!r} has {len(names)} class subfolder(s) ({', '.join(names) or 'none'}); "
            "give one subfolder per class, at least two"
        )
    for split, classes in per_split.items():
        for name, files in classes.items():
            if name not in names:
                raise DataError(
                    f"{split} class folder {name!r} is not a class of train ({', '.join(names)}); "
                    "rename or remove it"
                )
            if split == "train" and not files:
                raise DataError(
                    f"class folder {os.path.join(root, name)!r} holds no image "
                    f"({', '.join(IMAGE_SUFFIXES)}); add images or remove it"
                )
    return names


def _plan(root: str, seed: int) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """The class names and, per split, the ``(path, label)`` pairs in a seeded order that mixes classes."""
    folders = _split_folders(root)
    rng = np.random.default_rng(seed)
    if "train" in folders:
        per_split = {s: _class_files(p) for s, p in folders.items()}
        names = _check_classes(per_split, folders["train"])
        pairs = {
            s: [(f, names.index(c)) for c, files in classes.items() for f in files]
            for s, classes in per_split.items()
        }
        if (
            "validation" not in folders or "test" not in folders
        ):  # carved from train's end: shuffle it first
            pairs["train"] = [pairs["train"][i] for i in rng.permutation(len(pairs["train"]))]
        plan = plan_splits({s: len(p) for s, p in pairs.items()})
        splits = {s: pairs[src][a:b] for s, (src, a, b) in plan.items()}
    else:
        classes = _class_files(root)
        names = _check_classes({"train": classes}, root)
        splits = {"train": [], "validation": [], "test": []}
        for label, name in enumerate(names):
            files = [classes[name][i] for i in rng.permutation(len(classes[name]))]
            if len(files) < 3:
                raise DataError(
                    f"class folder {os.path.join(root, name)!r} has {len(files)} image(s), too few to "
                    "split into train, validation and test; add images (3 at least) or give "
                    "train/ val/ test/ subfolders"
                )
            cuts = {s: max(1, int(round(len(files) * f))) for s, f in FRACTIONS.items()}
            splits["test"] += [(f, label) for f in files[: cuts["test"]]]
            splits["validation"] += [
                (f, label) for f in files[cuts["test"] : cuts["test"] + cuts["validation"]]
            ]
            splits["train"] += [(f, label) for f in files[cuts["test"] + cuts["validation"] :]]
    for split, pairs in splits.items():
        if not pairs:
            raise DataError(f"split {split!r} of folder {root!r} would be empty; add images to it")
        splits[split] = [pairs[i] for i in rng.permutation(len(pairs))]
    return names, splits


def _read(path: str) -> tuple[bytes, tuple[int, int, int]]:
    """A file's bytes and decoded shape; DataError naming an empty or unreadable file."""
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise DataError(f"image {path!r} is empty (0 bytes); replace or remove it")
    try:
        shape = tuple(int(d) for d in tf.io.decode_image(data, expand_animations=False).shape)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
        reason = (e.message or str(e)).strip().splitlines()[0]
        raise DataError(
            f"image {path!r} cannot be decoded ({reason}); replace or remove it"
        ) from None
    return data, shape


def build_folder(out_dir: str, cfg: DataConfig, root: str) -> dict:
    """Writes a folder of class subfolders as shards of the images' own bytes.

    Returns:
        The manifest: ``image_shape`` ``[H, W, C]`` (``H``, ``W`` null when the sizes vary; ``C`` 1
        when every image is gray, else 3), ``class_names``, ``encoding: image`` and the splits.

    Raises:
        DataError: fewer than two classes, an empty class folder, a class missing from train, an
            empty, unreadable or undecodable image.
    """
    root = check_root(root)
    names, splits = _plan(root, cfg.seed)
    if cfg.limit > 0:
        splits = {s: p[: cfg.limit] for s, p in splits.items()}
    sizes: set[tuple[int, int]] = set()
    channels: set[int] = set()
    out = {}
    for split, pairs in splits.items():

        def records(pairs=pairs):
            for path, label in pairs:
                data, shape = _read(path)
                sizes.add(shape[:2])
                channels.add(shape[2])
                yield shards.encode_example(data, label)

        out[split] = {
            "num_records": len(pairs),
            "encoding": "image",
            "shards": shards.write_split(out_dir, split, records(), len(pairs), cfg.num_shards),
        }
    ((h, w),) = sizes if len(sizes) == 1 else [(None, None)]
    return {
        "description": f"images under {root}: {len(names)} classes",
        "image_shape": [h, w, 1 if channels == {1} else 3],
        "num_classes": len(names),
        "class_names": names,
        "encoding": "image",
        "splits": out,
    }
