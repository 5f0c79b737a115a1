"""Federated training, the library entry of ``python -m tfopt.federated``.

One run: the Job (data, run directory) -> the model built and seeded as ``tfopt train`` builds
it (its weights are round 0's global model) -> the training split dealt out to the clients
(:mod:`tfopt.federated.partition`) and written with the validation split and ``spec.json`` into
the work directory -> Flower's SuperLink and one SuperNode per client started
(:mod:`tfopt.federated.flower`) and tfopt's app run on them (:mod:`tfopt.federated.app`): each
round the server samples clients, each trains its partition and sends its weights back, the
server averages them (FedAvg or FedProx), backs the global model up and scores it on the
validation split -> the chief scores the last global model on the test split, saves it and
commits the run directory. A run killed part-way resumes from its last finished round.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time

from tfopt.core._keras import keras

import numpy as np

from tfopt import config as config_lib
from tfopt.config import RunConfig
from tfopt.core.errors import ConfigError, TfoptError
from tfopt.data.pipeline import load_split
from tfopt.federated import local
from tfopt.federated.flower import Flower
from tfopt.federated.partition import describe, partition
from tfopt.models import inputs, sources
from tfopt.models.io import save_model
from tfopt.runs import RunRecord
from tfopt.runtime.job import Job, replace_config, weights_digest

log = logging.getLogger(__name__)

PROG = "tfopt federated"
#: The files of the run's federated work directory (``spec.json`` names them to the app).
FILES = {
    "initial": "initial.npz",
    "validation": "validation.npz",
    "partitions": "partitions/client-{}.npz",
    "backup": "global.npz",
    "history": "history.json",
    "result": "result.json",
    "trainable": "model_trainable.tflite",
}
#: What stays in the committed run of the federated work directory: the round-0 global model
#: (a run is reproduced from it) and the Flower processes' logs.
KEPT = ("initial.npz", "logs")


def run(cfg: RunConfig, *, overwrite: bool = False) -> RunRecord:
    """Trains ``cfg.model`` over ``cfg.federated.clients`` Flower clients as ``cfg.federated`` says.

    Args:
        cfg: The resolved run configuration (``train.output_dir`` empty = ``runs/federated``,
            or the next free ``runs/federated-N``); the clients' batch is
            ``data.global_batch_size``.
        overwrite: Replace a finished run at ``train.output_dir``.

    Returns:
        The committed RunRecord.

    Raises:
        TfoptError: bad data, model or output directory, or a Flower run that did not finish.
    """
    cfg = replace_config(sources.resolve_config(cfg), runtime={"strategy": "one_device"})
    fed = cfg.federated
    _refuse_unread(cfg)
    with Job(cfg, "federated", overwrite=overwrite, build_model=sources.build_model) as job:
        built = sources.build(cfg.model, job.info.image_shape, job.info.num_classes)
        model = built.model
        inputs.adopt(job, model, cfg.model.name)
        work = os.path.join(job.open_work(), "federated")
        spec_path, table = _prepare(job, model, work)
        flower = Flower(work, fed.clients, fed.superlink, fed.engine == "simulation")
        started = time.perf_counter()
        try:
            flower.start()
            online = flower.wait_online(600 if fed.superlink else 120)
            job.say(
                f"{fed.clients} Flower clients online at {flower.address} in {online:.1f} s; "
                f"{fed.rounds} rounds of "
                f"{fed.algorithm}, {max(int(fed.clients * fed.fraction), 1)} clients each"
            )
            shown = _Progress(job, os.path.join(work, FILES["history"]), fed.rounds)
            flower.run(spec_path, shown)
        finally:
            flower.stop()
        seconds = time.perf_counter() - started
        result = _result(work)
        arrays, _ = local.load_arrays(os.path.join(work, FILES["backup"]))
        with open(spec_path, encoding="utf-8") as f:
            written = json.load(f)
        head = written.get("head")
        (model.get_layer(head) if head else model).set_weights(arrays)
        result["on_device"] = written.get("trainable")
        with open(os.path.join(work, FILES["history"]), encoding="utf-8") as f:
            history = json.load(f)
        record = _commit(job, model, built, work, table, history, {**result, "seconds": seconds})
        job.done(PROG, record, record.weights_sha256)
        return record


def _refuse_unread(cfg: RunConfig) -> None:
    """Refuses the settings of the shared sections that federated training does not read.

    Raises:
        ConfigError: one line naming the setting and the fix.
    """
    if cfg.data.service:
        raise ConfigError(
            f"--data-service {cfg.data.service} is not read by tfopt federated: each client "
            "reads its own partition from a file; drop --data-service"
        )
    if cfg.model.freeze_epochs:
        raise ConfigError(
            f"--freeze-epochs {cfg.model.freeze_epochs} is not read by tfopt federated: every "
            "client trains every layer; drop --freeze-epochs"
        )


def _prepare(job: Job, model: keras.Model, work: str) -> tuple[str, dict]:
    """Writes what the Flower app reads into ``work``: the round-0 weights (kept from an earlier
    attempt of this run), each client's partition, the validation split and ``spec.json``.
    Returns the spec's path and the partition's description."""
    cfg, fed = job.cfg, job.cfg.federated
    os.makedirs(os.path.join(work, "partitions"), exist_ok=True)
    initial = os.path.join(work, FILES["initial"])
    if not os.path.exists(initial):
        local.save_arrays(initial, model.get_weights())
    x, y = load_split(cfg.data, "train", info=job.info)
    parts = partition(y, fed, cfg.data.seed)
    for i, idx in enumerate(parts):
        local.save_arrays(os.path.join(work, FILES["partitions"].format(i)), [x[idx], y[idx]])
    local.save_arrays(
        os.path.join(work, FILES["validation"]),
        list(load_split(cfg.data, "validation", info=job.info)),
    )
    table = {
        "how": fed.partition,
        **({"shards_per_client": fed.shards_per_client} if fed.partition == "shards" else {}),
        **({"dirichlet_alpha": fed.dirichlet_alpha} if fed.partition == "dirichlet" else {}),
        "seed": cfg.data.seed,
        **describe(parts, y, job.info.num_classes),
    }
    spec = {
        **_on_device(model, job, work),
        "config": cfg.to_dict(),
        "image_shape": list(job.info.image_shape),
        "num_classes": job.info.num_classes,
        "files": FILES,
    }
    path = os.path.join(work, local.SPEC)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path, table


def _on_device(model: keras.Model, job: Job, work: str) -> dict:
    """Under ``--client-runtime litert``: writes the file the clients train (the model's head
    trainable at ``--client-lr``, the layers before it frozen) and returns the spec's ``head``
    (the layer the global arrays are) and ``trainable`` (the split, for the record)."""
    if job.cfg.federated.client_runtime != "litert":
        return {}
    from tfopt.models import ondevice

    part = ondevice.split(model)
    if not part.head.use_bias:
        raise ConfigError(
            f"--client-runtime litert trains the head {part.head.name!r} with its bias, and it "
            "has none; give a model whose last Dense layer has a bias, or --client-runtime keras"
        )
    content = ondevice.convert(part, job.info.image_shape, job.cfg.federated.client_lr, "logits")
    with open(os.path.join(work, FILES["trainable"]), "wb") as f:
        f.write(content)
    return {"head": part.head.name, "trainable": part.section()}


class _Progress:
    """Says each finished round (read from the server's history file) on the chief."""

    def __init__(self, job: Job, path: str, rounds: int):
        self.job, self.path, self.rounds, self.said = job, path, rounds, 0
        rows = self._rows()
        if rows:  # an earlier attempt of this run finished these rounds
            self.said = rows[-1]["round"]
            job.say(f"resuming after round {self.said} (the global model's last backup)")

    def _rows(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):  # not written yet
            return []

    def __call__(self) -> None:
        for row in self._rows():
            if row["round"] > self.said:
                self.said = row["round"]
                self.job.say(
                    f"round {row['round']}/{self.rounds}: validation accuracy "
                    f"{row['val_accuracy']:.2%} (loss {row['val_loss']:.4f}), "
                    f"{row['replies']}/{row['sampled']} clients replied, {row['seconds']:.1f} s"
                )


def _result(work: str) -> dict:
    """The server's ``result.json``.

    Raises:
        TfoptError: the Flower run ended without one (the server's log says why).
    """
    path = os.path.join(work, FILES["result"])
    if not os.path.exists(path):
        tail = ""
        server_log = os.path.join(work, "logs", "server.log")
        if os.path.exists(server_log):
            with open(server_log, encoding="utf-8", errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
            tail = next(
                (line for line in reversed(lines) if "rror" in line), lines[-1] if lines else ""
            )
        raise TfoptError(
            f"the Flower run ended before its last round ({tail[-300:]}); see {server_log}"
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _privacy(fed, rounds: int) -> dict | None:
    """Client-level DP's record: what was clipped and added, and the epsilon it spends."""
    if not fed.dp_clip:
        return None
    from tfopt.privacy import accountant

    q = max(int(fed.clients * fed.fraction), 1) / fed.clients
    return {
        "clip": fed.dp_clip,
        "noise_multiplier": fed.dp_noise,
        "delta": fed.dp_delta,
        "epsilon": accountant.epsilon(fed.dp_noise, q, rounds, fed.dp_delta),
        "mechanism": "Flower DifferentialPrivacyServerSideFixedClipping: each client's update "
        "clipped to the L2 norm `clip`, the updates averaged with equal weights, Gaussian noise "
        "of std noise_multiplier * clip / (clients sampled) added to the average",
        "sampling": f"{q:g} of the clients each round, sampled without replacement; accounted "
        "as Poisson sampling at that rate (exact at 1: no amplification)",
    }


def _runs_on(fed) -> str:
    """Where the clients ran, for the record."""
    if fed.superlink:
        return f"flower deployment at {fed.superlink}"
    if fed.engine == "simulation":
        return "flower simulation: one SuperLink running the clients' ClientApps in Ray actors"
    return "flower deployment: a SuperLink and one SuperNode per client, real processes"


def _commit(job, model, built, work, table, history, result) -> RunRecord:
    """Scores the final global model on the test split, saves it, tidies the work directory and
    commits the run."""
    fed = job.cfg.federated
    job.say(f"evaluating on the test split ({job.info.splits['test'].num_records} examples)")
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    metrics = model.evaluate(job.dataset("test"), return_dict=True, verbose=0)
    digest = weights_digest(model)
    artifacts = save_model(model, job.write_dir)
    for name in os.listdir(work):
        if name not in KEPT:
            path = os.path.join(work, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    artifacts["initial_weights"] = os.path.join(work, FILES["initial"])
    payload = result["payload_bytes"]
    section = {
        "runs_on": _runs_on(fed),
        "flwr": _flwr_version(),
        **{
            k: v
            for k, v in dataclasses.asdict(fed).items()
            if not k.startswith("dp_") and config_lib.reads(fed, k)
        },
        "batch_size": job.cfg.data.global_batch_size,
        "sampled_per_round": max(int(fed.clients * fed.fraction), 1),
        "partition": table,
        "resumed_from_round": result["resumed_from_round"],
        # the global model the last attempt started from, on the validation split
        "start_val_accuracy": result.get("initial_val_accuracy"),
        "payload_bytes": payload,
        "bytes_per_round": float(np.mean([r["bytes_down"] + r["bytes_up"] for r in history])),
        "failed_replies": int(sum(r["failed"] for r in history)),
        **({"on_device": result["on_device"]} if result.get("on_device") else {}),
        "seconds": round(result["seconds"], 3),
        **({"privacy": _privacy(fed, len(history))} if fed.dp_clip else {}),
    }
    record = job.record(
        model={
            "name": job.cfg.model.name,
            "params": int(model.count_params()),
            **built.description,
        },
        history=history,
        train={"seconds": round(result["seconds"], 3), "rounds": len(history)},
        metrics={f"test_{k}": float(v) for k, v in metrics.items()},
        weights_sha256=digest,
        artifacts=job.relative(artifacts),
        warnings=job.judge(model, metrics["accuracy"]),
        section=section,
    )
    out = job.commit(record)
    job.say(
        f"test accuracy {metrics['accuracy']:.1%} after {len(history)} rounds; wrote {out}; "
        f"next: python -m tfopt.export --from {out}"
    )
    return record


def _flwr_version() -> str:
    from importlib.metadata import version

    return version("flwr")
