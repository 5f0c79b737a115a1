"""``python -m tfopt.data.to_folder DATASET OUT``: any tfopt source written out as an image folder.

Writes ``OUT/train/<class>/00000.png``, ``OUT/val/...`` and ``OUT/test/...`` (the layout
``folder:OUT`` reads back as the same splits), one PNG per image, named by the source's class
names (``/`` replaced by ``_``; ``class_0``, ... when it has none). It makes a real dataset look like a user's own photos:
the README's bring-your-own-data example and benchmark B9 run on Fashion-MNIST written this way.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from tfopt.config import DataConfig, default_data_dir
from tfopt.core.errors import ConfigError, TfoptError

FOLDERS = {"train": "train", "validation": "val", "test": "test"}


def write_folder(cfg: DataConfig, out: str) -> dict[str, int]:
    """Writes every split of ``cfg.dataset`` (its first ``cfg.limit`` records each) as PNG class folders.

    The folder is written beside ``out`` and renamed into place, so a crash leaves no half folder.

    Args:
        cfg: The source (``dataset``, ``data_dir``, ``limit``); images are written as stored.
        out: The folder to make; it must not exist.

    Returns:
        Images written per split.

    Raises:
        ConfigError: ``out`` exists.
        DataError: the source cannot be prepared.
    """
    from tfopt.core._keras import tf

    from tfopt.core.fileio import atomic_dir
    from tfopt.data.pipeline import make_dataset
    from tfopt.data.sources import prepare

    if os.path.exists(out):
        raise ConfigError(f"{out!r} exists; give a new folder to write the images into")
    info = prepare(cfg)
    # A class name is a folder name: "T-shirt/top" becomes "T-shirt_top".
    names = [n.replace(os.sep, "_") for n in info.class_names] or [
        f"class_{k}" for k in range(info.num_classes)
    ]
    counts = {}
    with atomic_dir(os.path.abspath(out)) as tmp:
        for split, folder in FOLDERS.items():
            seen = np.zeros(info.num_classes, int)
            for images, labels in make_dataset(
                cfg, split, training=False, info=info
            ).as_numpy_iterator():
                for image, label in zip(np.rint(images * 255).astype(np.uint8), labels):
                    directory = os.path.join(tmp, folder, names[label])
                    if not seen[label]:
                        os.makedirs(directory, exist_ok=True)
                    with open(os.path.join(directory, f"{seen[label]:05d}.png"), "wb") as f:
                        f.write(tf.io.encode_png(image).numpy())
                    seen[label] += 1
            counts[split] = int(seen.sum())
    return counts


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tfopt.data.to_folder``; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="python -m tfopt.data.to_folder", description=__doc__.splitlines()[0]
    )
    p.add_argument("dataset", help="mnist, fashion_mnist, digits, tfds:NAME, tfrecord:GLOB")
    p.add_argument("out", help="the folder to write (must not exist)")
    p.add_argument("--limit", type=int, default=0, help="images per split (0 = all)")
    p.add_argument("--data-dir", default=default_data_dir(), help="dataset cache directory")
    args = p.parse_args(argv)
    try:
        counts = write_folder(
            DataConfig(dataset=args.dataset, data_dir=args.data_dir, limit=args.limit), args.out
        )
    except TfoptError as e:
        print(f"tfopt.data.to_folder: error: {e}", file=sys.stderr)
        return 2
    print(
        f"tfopt.data.to_folder: wrote {', '.join(f'{n} {s}' for s, n in counts.items())} images to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
