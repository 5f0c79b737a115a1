"""tfopt's Flower app: the ServerApp (``server``) and the ClientApp (``client``).

Flower's SuperLink starts the ServerApp in a process of its own for the run, and each SuperNode
starts the ClientApp in a new process for every message it gets; both find the run's
``spec.json`` (written by the chief, :mod:`tfopt.federated.stage`) through the run config key
``spec``. The server keeps the global model in the run's work directory after every round (its
backup: a restarted run goes on from there) and scores it on the validation split; a client
trains its partition (:func:`tfopt.federated.local.fit`) and sends the weights back with its
example count, by which FedAvg weighs them.
"""

from __future__ import annotations

import json
import os
import random
import time

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg, FedProx

from tfopt.core.fileio import write_json

server = ServerApp()
client = ClientApp()

#: The ClientApp's reply key FedAvg weighs the clients' models by.
EXAMPLES = "num-examples"
#: The ClientApp's reply key of weight 1 (equal weights, under client-level DP).
UNIT = "unit-weight"
#: The ClientApp's reply key naming its partition (the order the server sums the models in).
PARTITION = "partition-id"


def _spec(context: Context) -> dict:
    from tfopt.federated import local

    return local.read_spec(str(context.run_config["spec"]))


def _counted(base: type) -> type:
    """``base`` (a Flower strategy class) that also counts, per round, the clients it sampled,
    the replies it got and the clients that failed or never answered."""

    class Counted(base):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.rounds: dict[int, dict] = {}

        def configure_train(self, server_round, arrays, config, grid):
            messages = list(super().configure_train(server_round, arrays, config, grid))
            self.rounds[server_round] = {"sampled": len(messages), "started": time.time()}
            return messages

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            good = [m for m in replies if not m.has_error()]
            row = self.rounds[server_round]
            row["replies"] = len(good)
            row["failed"] = row["sampled"] - len(good)
            row["examples"] = int(sum(m.content["metrics"][EXAMPLES] for m in good))
            # Summed in the clients' order, not the replies' arrival order: the same updates
            # give the same global model, bit for bit (a resumed run equals an uninterrupted one).
            good.sort(key=lambda m: m.content["metrics"][PARTITION])
            return super().aggregate_train(
                server_round, [*good, *(m for m in replies if m.has_error())]
            )

    Counted.__name__ = base.__name__
    return Counted


def _strategy(fed, sampled: int):
    """The Flower strategy ``fed`` (the ``federated`` config section) asks for."""
    common = {
        "fraction_train": fed.fraction,
        "fraction_evaluate": 0.0,  # the server scores the global model itself
        # The chief starts the run once every client is online; a client lost since is left
        # out of the later rounds' samples (fraction of those online) instead of awaited.
        "min_train_nodes": 1,
        "min_available_nodes": 1,
        # DP-FedAvg's sensitivity bound (one client moves the average by at most clip / n)
        # holds for equal weights only; otherwise FedAvg weighs each client by its examples.
        "weighted_by_key": UNIT if fed.dp_clip else EXAMPLES,
    }
    counted = (
        _counted(FedProx)(**common, proximal_mu=fed.proximal_mu)
        if fed.algorithm == "fedprox"
        else _counted(FedAvg)(**common)
    )
    if not fed.dp_clip:
        return counted, counted
    private = DifferentialPrivacyServerSideFixedClipping(
        counted,
        noise_multiplier=fed.dp_noise,
        clipping_norm=fed.dp_clip,
        num_sampled_clients=sampled,
    )
    return private, counted


@server.main()
def serve(grid: Grid, context: Context) -> None:
    """The server's side of the run: resume from the last round's backup, run the remaining
    rounds, back up and score the global model after each, and write the result."""
    from tfopt.federated import local

    spec = _spec(context)
    cfg, fed = spec["cfg"], spec["cfg"].federated
    model, put = local.global_model(spec)
    backup, history_path = local.path_of(spec, "backup"), local.path_of(spec, "history")
    if os.path.exists(backup):
        arrays, info = local.load_arrays(backup)
        done = int(info["round"])
    else:
        arrays, done = local.start_arrays(spec, model), 0
    history = []
    if os.path.exists(history_path):
        with open(history_path, encoding="utf-8") as f:
            history = [row for row in json.load(f) if row["round"] <= done]
    x_val, y_val = local.load_arrays(local.path_of(spec, "validation"))[0]
    payload = sum(a.nbytes for a in arrays)
    sampled = max(int(fed.clients * fed.fraction), 1)
    strategy, counted = _strategy(fed, sampled)
    random.seed(cfg.train.seed * 1_000_003 + done)  # Flower samples the clients with `random`
    started = time.time()
    first: dict = {}

    def evaluate(server_round: int, record: ArrayRecord) -> MetricRecord:
        weights = record.to_numpy_ndarrays()
        put(weights)
        scores = local.score(model, x_val, y_val)
        if server_round == 0:
            first.setdefault("initial_val_accuracy", scores["accuracy"])
            return MetricRecord({"val_loss": scores["loss"], "val_accuracy": scores["accuracy"]})
        row = counted.rounds.get(server_round, {})
        absolute = done + server_round
        history.append(
            {
                "round": absolute,
                "val_loss": scores["loss"],
                "val_accuracy": scores["accuracy"],
                "sampled": row.get("sampled", 0),
                "replies": row.get("replies", 0),
                "failed": row.get("failed", 0),
                "examples": row.get("examples", 0),
                "bytes_down": row.get("sampled", 0) * payload,
                "bytes_up": row.get("replies", 0) * payload,
                "seconds": round(time.time() - row.get("started", started), 3),
            }
        )
        local.save_arrays(backup, weights, round=absolute)
        write_json(history_path, history)
        return MetricRecord({"val_loss": scores["loss"], "val_accuracy": scores["accuracy"]})

    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(arrays),
        num_rounds=fed.rounds - done,
        timeout=fed.round_timeout,
        train_config=ConfigRecord(
            {
                "round-offset": done,
                "local-epochs": fed.local_epochs,
                "batch-size": cfg.data.global_batch_size,
                "lr": fed.client_lr,
            }
        ),
        evaluate_fn=evaluate,
    )
    write_json(
        local.path_of(spec, "result"),
        {"resumed_from_round": done, "rounds": fed.rounds, "payload_bytes": payload, **first},
    )


@client.train()
def train(msg: Message, context: Context) -> Message:
    """One client's round: its partition, trained from the global model it was sent."""
    from tfopt.federated import local

    local.deterministic()
    spec = _spec(context)
    part = int(context.node_config["partition-id"])
    sent = msg.content["config"]
    (x, y), _ = local.load_arrays(local.path_of(spec, "partitions").format(part))
    round_ = int(sent["round-offset"]) + int(sent["server-round"])
    arrays = msg.content["arrays"].to_numpy_ndarrays()
    common = {
        "epochs": int(sent["local-epochs"]),
        "batch_size": int(sent["batch-size"]),
        "seed": local.client_seed(spec["cfg"].train.seed, round_, part),
    }
    if spec["cfg"].federated.client_runtime == "litert":  # the head, in LiteRT, as on a phone
        path = local.path_of(spec, "trainable")
        weights, metrics = local.fit_litert(path, arrays, x, y, **common)
    else:
        model = local.build(spec)
        mu = float(sent.get("proximal-mu", 0.0))
        weights, metrics = local.fit(model, arrays, x, y, lr=float(sent["lr"]), mu=mu, **common)
    reply = {
        "arrays": ArrayRecord(weights),
        "metrics": MetricRecord(
            {
                EXAMPLES: len(y),
                PARTITION: part,
                UNIT: 1,
                "train_loss": metrics["loss"],
                "pid": os.getpid(),
            }
        ),
    }
    return Message(content=RecordDict(reply), reply_to=msg)
