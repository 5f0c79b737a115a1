"""Benchmark B1's data: synthetic JPEG shards, and the three pipelines over the same files and parse function."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time

import numpy as np
from tqdm import tqdm

from bench._common import (
    CpuSample,
)
from bench._ingestion_params import DATASET_VERSION, NORMALIZE, NUM_CLASSES, Params
from tfopt import tf
from tfopt.config import DataConfig, parse_normalize
from tfopt.data import (
    build,
)

# --------------------------------------------------------------------------------------------
# Synthetic JPEG shards
# --------------------------------------------------------------------------------------------


def _synth_image(rng: np.random.Generator, h: int, w: int, label: int) -> np.ndarray:
    """An image-like uint8 HxWx3 array: smooth gradients + waves, a few class-coloured
    shapes (one with fine texture), and sensor-like noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy /= h
    xx /= w
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        a, b, phase = rng.uniform(-1.0, 1.0, 3)
        freq = rng.uniform(0.5, 3.0)
        img[..., c] = (
            128
            + 60 * (a * xx + b * yy)
            + 40 * np.sin(2 * np.pi * freq * (a * xx + b * yy) + 3 * phase)
        )
    angle = 2 * np.pi * label / NUM_CLASSES
    hue = 128 + 100 * np.cos(angle + np.array([0.0, 2.1, 4.2]))
    for k in range(int(rng.integers(2, 6))):
        cy, cx = rng.uniform(0.15, 0.85, 2)
        ry, rx = rng.uniform(0.06, 0.3, 2)
        if rng.random() < 0.5:
            mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
        else:
            mask = (np.abs(yy - cy) < ry) & (np.abs(xx - cx) < rx)
        shade = 0.7 * hue + 0.3 * img[mask]
        if k == 0:  # fine texture, so the JPEG has high-frequency content to code
            fy, fx = rng.uniform(8, 30, 2)
            shade += (25 * np.sin(2 * np.pi * (fy * yy[mask] + fx * xx[mask])))[:, None]
        img[mask] = shade
    img += rng.normal(0.0, 6.0, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _dataset_key(p: Params) -> str:
    spec = dict(
        v=DATASET_VERSION, n=p.images, shards=p.shards, lo=p.min_side, hi=p.max_side, seed=p.seed
    )
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return f"b1-jpeg-n{p.images}-s{p.shards}-{p.min_side}to{p.max_side}-{digest}"


def _count_records(path: str) -> int:
    return int(tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda n, _: n + 1).numpy())


def _check_manifest(root: str) -> list[str] | None:
    """Returns the shard paths if ``root`` holds a complete, intact dataset, else None."""
    try:
        with open(os.path.join(root, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    files = []
    for shard in manifest.get("shards", []):
        path = os.path.join(root, shard["file"])
        if not os.path.isfile(path) or os.path.getsize(path) != shard["bytes"]:
            return None
        try:
            if (
                _count_records(path) != shard["records"]
            ):  # a truncated TFRecord loses records silently
                return None
        except tf.errors.OpError:
            return None
        files.append(path)
    return files or None


def ensure_dataset(workdir: str, p: Params, log=print) -> tuple[list[str], dict]:
    """Returns the shard paths (making them once) and a summary of the dataset."""
    root = os.path.join(workdir, _dataset_key(p))
    files = _check_manifest(root)
    if files is None:
        if os.path.exists(root):
            log(f"[B1] {root} is incomplete or damaged (manifest check failed); regenerating it")
            shutil.rmtree(root)
        os.makedirs(workdir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-b1-", dir=workdir)
        t0 = time.perf_counter()
        rng = np.random.default_rng(p.seed)
        writers = [
            tf.io.TFRecordWriter(os.path.join(tmp, f"shard-{i:02d}-of-{p.shards:02d}.tfrecord"))
            for i in range(p.shards)
        ]
        counts = [0] * p.shards
        try:
            for i in tqdm(
                range(p.images),
                desc="B1 make JPEG shards",
                unit="img",
                leave=False,
                disable=True if p.smoke else None,
            ):
                h, w = (int(v) for v in rng.integers(p.min_side, p.max_side + 1, 2))
                label = int(rng.integers(0, NUM_CLASSES))
                jpeg = tf.io.encode_jpeg(
                    _synth_image(rng, h, w, label), quality=int(rng.integers(80, 96))
                ).numpy()
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                            "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[h])),
                            "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[w])),
                        }
                    )
                )
                writers[i % p.shards].write(ex.SerializeToString())
                counts[i % p.shards] += 1
        finally:
            for wr in writers:
                wr.close()
        shards = []
        for i in range(p.shards):
            name = f"shard-{i:02d}-of-{p.shards:02d}.tfrecord"
            shards.append(
                {
                    "file": name,
                    "records": counts[i],
                    "bytes": os.path.getsize(os.path.join(tmp, name)),
                }
            )
        manifest = {
            "version": DATASET_VERSION,
            "images": p.images,
            "sides": [p.min_side, p.max_side],
            "seed": p.seed,
            "shards": shards,
        }
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
        try:
            os.replace(tmp, root)  # atomic publish; a concurrent maker may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        files = _check_manifest(root)
        if files is None:
            raise RuntimeError(
                f"[B1] the dataset written to {root} does not pass its manifest check"
            )
        log(
            f"[B1] made {p.images} JPEGs in {p.shards} shards under {root} ({time.perf_counter() - t0:.1f} s)"
        )
    total = sum(os.path.getsize(f) for f in files)
    return files, {
        "path": root,
        "shards": len(files),
        "images": p.images,
        "bytes": total,
        "mean_jpeg_bytes": round(total / p.images),
        "sides_px": [p.min_side, p.max_side],
    }


# --------------------------------------------------------------------------------------------
# The three pipelines over the same files and the same parse function
# --------------------------------------------------------------------------------------------


def make_parse(p: Params):
    """serialized Example -> (uint8 [R, R, 3] decoded + resized, int32 label): deterministic, so the
    cached pipelines cache its output (uint8: a quarter of float32's memory)."""
    r = p.resize
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(serialized):
        ex = tf.io.parse_single_example(serialized, spec)
        img = tf.io.decode_jpeg(ex["image"], channels=3)
        img = tf.image.resize(img, [r, r], method="bilinear")
        img = tf.cast(tf.clip_by_value(tf.round(img), 0.0, 255.0), tf.uint8)
        return img, tf.cast(ex["label"], tf.int32)

    return parse


def tfopt_config(p: Params, **knobs) -> DataConfig:
    """The tfopt DataConfig: crop_flip + imagenet normalization, every knob AUTOTUNE unless given,
    memory cache unless given."""
    base = DataConfig(
        dataset="b1-jpeg",
        seed=p.seed,
        cache="memory",
        global_batch_size=p.batch_size,
        augment="crop_flip",
        crop_size=p.crop,
        normalize=NORMALIZE,
    )
    return dataclasses.replace(base, **knobs)


def tfopt_dataset(files, parse, p: Params, cfg: DataConfig) -> tf.data.Dataset:
    """tfopt's training stream: endless passes, each a fresh order of the split."""
    return build(files, parse, cfg, training=True, batch_size=p.batch_size, num_records=p.images)


def guide_kwargs(p: Params) -> dict:
    mean, std = parse_normalize(NORMALIZE)
    return dict(crop=p.crop, mean=mean, std=std, batch_size=p.batch_size)


def epochs_of(ds, steps: int):
    """Returns ``epoch()``: a generator of the next ``steps`` batches of one iterator of ``ds``,
    created lazily inside the first timed epoch (so its start-up is timed, as for the peers)."""
    state = {}

    def epoch():
        if "it" not in state:
            state["it"] = iter(ds)
        for _ in range(steps):
            yield next(state["it"])

    return epoch


def run_epoch(batches) -> tuple[float, float]:
    """Iterates one epoch, consuming nothing; returns (images/s, foreign load during it)."""
    n = 0
    with CpuSample() as s:
        for batch in batches:
            n += int(batch[0].shape[0])
    return n / s.wall, s.foreign


def _spread(values) -> list[float]:
    vals = [v for v in values if v == v]
    return [min(vals), max(vals)] if vals else []
