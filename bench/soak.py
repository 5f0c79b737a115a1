"""Soak (S1): a long ``tfopt.train`` run with backups and validation; does anything grow?

One process trains the ``small_cnn`` on the embedded digits for ``--steps`` optimizer steps
(default 10,000: ``--epochs`` epochs of ``--steps-per-epoch`` steps over the repeated training
split), with validation every epoch, an epoch-end backup and one every ``--backup-every`` steps,
exactly as ``python -m tfopt.train`` runs. A Keras callback samples, at every epoch end, the
process's resident memory (``/proc/self/statm``), its open file descriptors (``/proc/self/fd``),
its threads (``/proc/self/status``) and the bytes under the run's ``backup/`` directory.

Figures (the first epoch is warm-up: tracing, caches filling):

- resident memory growth per epoch after the first: the least-squares slope over every later
  epoch, in KiB (target < 1024 KiB, i.e. under 1 MiB per epoch);
- open files and threads: the most seen after the first epoch minus the count at its end (target 0);
- backup disk: the largest ``backup/`` in the second half of the run over the largest in the first
  half (target <= 1.1: backups are rotated, the disk used is bounded).

    PYTHONPATH=. python bench/soak.py                       # ~5 min on 2 cores -> bench/results/soak.json
    PYTHONPATH=. python bench/soak.py --epochs 12 --steps-per-epoch 25 --out /tmp/soak.json   # the CI smoke
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _common  # noqa: E402


def sample(backup_dir: str) -> dict:
    """This process's resident KiB, open files, threads, and the bytes under ``backup_dir``."""
    with open("/proc/self/statm") as f:
        rss_kib = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    with open("/proc/self/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    disk = sum(
        os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(backup_dir) for n in names
    )
    return {
        "rss_kib": rss_kib,
        "open_files": len(os.listdir("/proc/self/fd")),
        "threads": threads,
        "backup_bytes": disk,
    }


def slope(values: list[float]) -> float:
    """The least-squares slope of ``values`` against their index (per step of the index)."""
    n = len(values)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum(
        (i - mx) ** 2 for i in range(n)
    )


def summarize(rows: list[dict]) -> dict:
    """The soak's statistics over the epochs after the first (see the module doc)."""
    later = rows[1:]
    half = max(1, len(later) // 2)
    first_half = max(r["backup_bytes"] for r in later[:half])
    return {
        "rss_kib_per_epoch": round(slope([r["rss_kib"] for r in later]), 1),
        "open_files_growth": max(r["open_files"] for r in later) - later[0]["open_files"],
        "threads_growth": max(r["threads"] for r in later) - later[0]["threads"],
        "backup_bytes_max": max(r["backup_bytes"] for r in later),
        "backup_growth_ratio": round(max(r["backup_bytes"] for r in later[half:]) / first_half, 3)
        if first_half
        else None,
    }


def run(epochs: int, steps_per_epoch: int, backup_every: int, work: str) -> list[dict]:
    """Trains in this process; returns one sample per epoch end."""
    from tfopt import config as C
    from tfopt import keras
    from tfopt.train import run as train

    out = os.path.join(work, "soak")
    rows: list[dict] = []
    started = time.perf_counter()

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rows.append(
                {
                    "epoch": epoch + 1,
                    "seconds": round(time.perf_counter() - started, 2),
                    **sample(os.path.join(out + ".partial", "backup")),
                }
            )
            if (epoch + 1) % max(1, epochs // 10) == 0:
                r = rows[-1]
                print(
                    f"[soak] epoch {epoch + 1}/{epochs}: {r['rss_kib'] / 1024:.0f} MiB resident, "
                    f"{r['open_files']} files, {r['threads']} threads, {r['backup_bytes'] / 1024:.0f} KiB backups",
                    flush=True,
                )

    cfg = C.from_dict(
        {
            "data": {
                "dataset": "digits",
                "global_batch_size": 32,
                "data_dir": os.path.join(work, "data"),
            },
            "model": {"name": "small_cnn"},
            "runtime": {"strategy": "one_device"},
            "train": {
                "epochs": epochs,
                "steps_per_epoch": steps_per_epoch,
                "backup_every": backup_every,
                "output_dir": out,
                "verbose": 0,
                "tensorboard": True,
            },
        }
    )
    train(cfg, callbacks=[Probe()])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = _common.script_parser(__doc__, "soak", None)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--steps-per-epoch", type=int, default=100)
    p.add_argument("--backup-every", type=int, default=40, help="steps between mid-epoch backups")
    args = p.parse_args(argv)
    if args.epochs < 3:
        p.error(
            f"--epochs {args.epochs} must be >= 3 (the first is warm-up; growth needs two more)"
        )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfopt-soak-") as work:
        rows = run(args.epochs, args.steps_per_epoch, args.backup_every, work)
    stats = summarize(rows)
    figures = [
        _common.figure(
            "resident memory growth per epoch after the first",
            [stats["rss_kib_per_epoch"]],
            "KiB",
            target=("<", 1024),
            digits=1,
            detail=f"{rows[1]['rss_kib'] / 1024:.0f} -> {rows[-1]['rss_kib'] / 1024:.0f} MiB over "
            f"{len(rows) - 1} epochs",
        ),
        _common.figure(
            "open files: growth after the first epoch",
            [stats["open_files_growth"]],
            "files",
            target=("<=", 0),
            digits=0,
        ),
        _common.figure(
            "threads: growth after the first epoch",
            [stats["threads_growth"]],
            "threads",
            target=("<=", 0),
            digits=0,
        ),
        _common.figure(
            "backup disk: largest in the 2nd half / largest in the 1st",
            [stats["backup_growth_ratio"]],
            "x",
            target=("<=", 1.1),
            digits=2,
            detail=f"at most {stats['backup_bytes_max'] / 1024:.0f} KiB under backup/",
        ),
    ]
    steps = args.epochs * args.steps_per_epoch
    res = _common.result(
        "S1",
        "soak",
        "PYTHONPATH=. python bench/soak.py",
        figures,
        parameters={
            "epochs": args.epochs,
            "steps_per_epoch": args.steps_per_epoch,
            "steps": steps,
            "backup_every": args.backup_every,
        },
        statistics=stats,
        epochs=rows,
    )
    ok = all(f["status"] == "pass" for f in figures)
    table = _common.figures_table(figures)
    return _common.publish(res, args.out, "S1", table=table, started=started, code=0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
