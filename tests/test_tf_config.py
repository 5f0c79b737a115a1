"""TF_CONFIG parsing and validation: a table of good and bad configs."""

import json

import pytest

from tfopt.core.errors import ClusterError, ConfigError
from tfopt.runtime.tf_config import (
    ClusterInfo,
    cluster_from_env,
    parse_tf_config,
    validate_for_strategy,
)

W2 = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
PS = {
    "chief": ["127.0.0.1:2220"],
    "worker": ["127.0.0.1:2222", "127.0.0.1:2223"],
    "ps": ["127.0.0.1:2230"],
}
CW = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]}


def tf_config(cluster, task_type="worker", index=0, **extra) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


GOOD = [
    # (TF_CONFIG, strategy, task_type, index, is_chief, num_workers, peers)
    (tf_config(W2, "worker", 0), "multi_worker_mirrored", "worker", 0, True, 2, ["127.0.0.1:2223"]),
    (
        tf_config(W2, "worker", 1),
        "multi_worker_mirrored",
        "worker",
        1,
        False,
        2,
        ["127.0.0.1:2222"],
    ),
    (
        tf_config(PS, "chief", 0),
        "parameter_server",
        "chief",
        0,
        True,
        2,
        ["127.0.0.1:2222", "127.0.0.1:2223", "127.0.0.1:2230"],
    ),
    (
        tf_config(PS, "ps", 0),
        "parameter_server",
        "ps",
        0,
        False,
        2,
        ["127.0.0.1:2220", "127.0.0.1:2222", "127.0.0.1:2223"],
    ),
    (tf_config(CW, "worker", 0), "multi_worker_mirrored", "worker", 0, False, 1, ["10.0.0.1:2222"]),
    (tf_config(CW, "chief", 0), "multi_worker_mirrored", "chief", 0, True, 1, ["10.0.0.2:2222"]),
    (tf_config({"worker": ["localhost:1"]}, "worker", 0), "mirrored", "worker", 0, True, 1, []),
]


@pytest.mark.parametrize("text,strategy,task_type,index,chief,num_workers,peers", GOOD)
def test_good_configs(text, strategy, task_type, index, chief, num_workers, peers):
    info = parse_tf_config(text)
    assert isinstance(info, ClusterInfo)
    assert (info.task_type, info.task_index, info.is_chief, info.num_workers) == (
        task_type,
        index,
        chief,
        num_workers,
    )
    assert info.peers() == peers
    assert info.rpc_layer == "grpc"
    validate_for_strategy(info, strategy)
    assert parse_tf_config(json.dumps(info.to_dict())) == info  # round trip


@pytest.mark.parametrize("text", [None, "", "   "])
def test_unset_is_none(text):
    assert parse_tf_config(text) is None


def test_from_env_and_peers_by_role():
    info = cluster_from_env({"TF_CONFIG": tf_config(PS, "worker", 1)})
    assert info.address == "127.0.0.1:2223"
    assert info.peers(("chief", "worker")) == ["127.0.0.1:2220", "127.0.0.1:2222"]
    assert cluster_from_env({}) is None


BAD = [
    # (id, TF_CONFIG, substrings the one-line message must contain)
    ("bad-json", '{"cluster": ', ["not valid JSON", '{"cluster": ']),
    ("not-object", "[1, 2]", ["[1, 2]", "not an object"]),
    ("string", '"worker"', ["'worker'", "not an object"]),
    ("missing-cluster", json.dumps({"task": {"type": "worker", "index": 0}}), ["'cluster'"]),
    ("missing-task", json.dumps({"cluster": W2}), ["'task'"]),
    (
        "unknown-top-key",
        json.dumps({"cluster": W2, "task": {"type": "worker", "index": 0}, "tasks": 1}),
        ["'tasks'", "cluster, task"],
    ),
    (
        "cluster-not-object",
        json.dumps({"cluster": ["a:1"], "task": {"type": "worker", "index": 0}}),
        ["['a:1']", "not an object"],
    ),
    (
        "unknown-role",
        tf_config({"workers": ["h:1"]}, "workers"),
        ["'workers'", "chief, worker, ps, evaluator"],
    ),
    ("empty-role", tf_config({"worker": []}), ["cluster.worker=[]", "non-empty"]),
    ("role-not-list", tf_config({"worker": "h:1"}), ["cluster.worker='h:1'", "non-empty list"]),
    ("no-port", tf_config({"worker": ["localhost"]}), ["'localhost'", "no port"]),
    ("empty-port", tf_config({"worker": ["localhost:"]}), ["'localhost:'", "no port"]),
    ("no-host", tf_config({"worker": [":2222"]}), ["':2222'", "no host"]),
    ("port-0", tf_config({"worker": ["h:0"]}), ["'h:0'", "1..65535"]),
    ("port-70000", tf_config({"worker": ["h:70000"]}), ["'h:70000'", "70000", "1..65535"]),
    ("port-abc", tf_config({"worker": ["h:abc"]}), ["'h:abc'", "'abc'", "not an integer"]),
    (
        "port-underscore",
        tf_config({"worker": ["h:2_222"]}),
        ["'h:2_222'", "'2_222'", "not an integer"],
    ),
    ("port-space", tf_config({"worker": ["h: 2222"]}), ["'h: 2222'", "' 2222'", "not an integer"]),
    (
        "host-space",
        tf_config({"worker": ["my host:2222"]}),
        ["'my host'", "not a host name or IP address"],
    ),
    ("host-scheme", tf_config({"worker": ["grpc://h:2222"]}), ["'grpc://h'", "not a host name"]),
    (
        "rpc-layer",
        json.dumps(
            {"cluster": W2, "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc+verbs"}
        ),
        ["rpc_layer='grpc+verbs'", "choose one of grpc"],
    ),
    ("address-not-string", tf_config({"worker": [2222]}), ["cluster.worker[0]=2222", "host:port"]),
    (
        "duplicate-address",
        tf_config({"chief": ["h:1"], "worker": ["h:2", "h:1"]}, "chief"),
        ["'h:1'", "chief[0]", "worker[1]"],
    ),
    (
        "two-chiefs",
        tf_config({"chief": ["h:1", "h:2"], "worker": ["h:3"]}, "chief"),
        ["2 chiefs", "'h:1'", "'h:2'"],
    ),
    ("task-type-not-in-cluster", tf_config(W2, "chief"), ["task.type='chief'", "worker"]),
    ("task-no-type", json.dumps({"cluster": W2, "task": {"index": 0}}), ['no "type"']),
    (
        "task-no-index",
        json.dumps({"cluster": W2, "task": {"type": "worker"}}),
        ['no "index"', "0..1"],
    ),
    ("task-not-object", json.dumps({"cluster": W2, "task": "worker"}), ["task='worker'"]),
    (
        "index-out-of-range",
        tf_config(W2, "worker", 3),
        ["task.index=3", "'worker'", "2 tasks: 0..1", "fix the index"],
    ),
    ("index-negative", tf_config(W2, "worker", -1), ["task.index=-1", "0..1"]),
    ("index-string", tf_config(W2, "worker", "0"), ["task.index='0'", "not an integer"]),
    ("index-float", tf_config(W2, "worker", 1.0), ["task.index=1.0", "not an integer"]),
    ("index-bool", tf_config(W2, "worker", True), ["task.index=True", "not an integer"]),
]


@pytest.mark.parametrize("text,expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_configs(text, expected):
    with pytest.raises(ClusterError) as err:
        parse_tf_config(text)
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


MISMATCH = [
    # (id, cluster dict or None, task type, strategy, substrings)
    (
        "mirrored-multi-task",
        W2,
        "worker",
        "mirrored",
        ["2-task cluster", "worker:2", "'mirrored'", "multi_worker_mirrored"],
    ),
    ("one-device-multi-task", CW, "chief", "one_device", ["'one_device'", "unset TF_CONFIG"]),
    (
        "mwms-with-ps",
        PS,
        "chief",
        "multi_worker_mirrored",
        ["ps", "'multi_worker_mirrored'", "parameter_server"],
    ),
    (
        "mwms-worker-without-peers",
        {"ps": ["h:1"]},
        "ps",
        "multi_worker_mirrored",
        ["ps", "'multi_worker_mirrored'"],
    ),
    (
        "mwms-evaluator-with-ps",
        {"ps": ["h:1"], "evaluator": ["h:2"]},
        "evaluator",
        "multi_worker_mirrored",
        ["ps tasks", "'multi_worker_mirrored'"],
    ),
    (
        "mirrored-chief-worker-evaluator",
        {"chief": ["h:1"], "worker": ["h:2"], "evaluator": ["h:3"]},
        "evaluator",
        "mirrored",
        ["2-task cluster", "evaluator:1", "'mirrored'"],
    ),
    ("ps-without-tf-config", None, None, "parameter_server", ["needs TF_CONFIG", "tfopt.launch"]),
    ("ps-without-ps", CW, "chief", "parameter_server", ["a ps", "'parameter_server'"]),
    (
        "ps-without-chief",
        {"worker": ["h:1"], "ps": ["h:2"]},
        "worker",
        "parameter_server",
        ["a chief"],
    ),
]


@pytest.mark.parametrize(
    "cluster,task_type,strategy,expected", [m[1:] for m in MISMATCH], ids=[m[0] for m in MISMATCH]
)
def test_strategy_mismatch(cluster, task_type, strategy, expected):
    info = parse_tf_config(tf_config(cluster, task_type)) if cluster else None
    with pytest.raises(ClusterError) as err:
        validate_for_strategy(info, strategy)
    for part in expected:
        assert part in str(err.value), f"{part!r} not in {str(err.value)!r}"


@pytest.mark.parametrize("strategy", ["one_device", "mirrored", "multi_worker_mirrored"])
def test_single_process_strategies_accept_no_tf_config(strategy):
    validate_for_strategy(None, strategy)


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(
        ConfigError,
        match="'mirorred'.*one_device, mirrored, multi_worker_mirrored, parameter_server",
    ):
        validate_for_strategy(None, "mirorred")


# -- TF_CONFIG as the Kubeflow training operator (TFJob, kubeflow.org/v1) writes it --------------


def operator_cluster(job="job", ns="ns", chief=1, workers=2, ps=1, evaluator=1) -> dict:
    """The ``cluster`` the operator writes: ``<job>-<role>-<i>.<namespace>.svc:2222``, evaluator included (1.9)."""
    counts = {"chief": chief, "worker": workers, "ps": ps, "evaluator": evaluator}
    return {
        role: [f"{job}-{role}-{i}.{ns}.svc:2222" for i in range(n)]
        for role, n in counts.items()
        if n
    }


def operator_tf_config(task_type, index, **counts) -> str:
    return json.dumps(
        {
            "cluster": operator_cluster(**counts),
            "task": {"type": task_type, "index": index},
            "environment": "cloud",
        }
    )


def test_the_operator_example_verbatim():
    text = (
        '{"cluster":{"chief":["job-chief-0.ns.svc:2222"],"worker":["job-worker-0.ns.svc:2222",'
        '"job-worker-1.ns.svc:2222"],"ps":["job-ps-0.ns.svc:2222"],"evaluator":["job-evaluator-0.ns.svc:2222"]},'
        '"task":{"type":"worker","index":1},"environment":"cloud"}'
    )
    info = parse_tf_config(text)
    assert (info.task_type, info.task_index, info.environment) == ("worker", 1, "cloud")
    assert info.address == "job-worker-1.ns.svc:2222"
    assert not info.is_chief and not info.is_evaluator
    validate_for_strategy(info, "parameter_server")
    assert (
        parse_tf_config(json.dumps(info.to_dict())) == info
    )  # environment survives the round trip


PS_PEERS = [
    "job-chief-0.ns.svc:2222",
    "job-worker-0.ns.svc:2222",
    "job-worker-1.ns.svc:2222",
    "job-ps-0.ns.svc:2222",
]

OPERATOR = [
    # (task type, index, strategy, cluster counts, is_chief, is_evaluator, num_workers, peers())
    ("chief", 0, "parameter_server", {}, True, False, 2, PS_PEERS[1:]),
    ("worker", 0, "parameter_server", {}, False, False, 2, [PS_PEERS[0], PS_PEERS[2], PS_PEERS[3]]),
    ("ps", 0, "parameter_server", {}, False, False, 2, PS_PEERS[:3]),
    ("evaluator", 0, "parameter_server", {}, False, True, 2, []),
    (
        "worker",
        1,
        "multi_worker_mirrored",
        {"chief": 0, "ps": 0},
        False,
        False,
        2,
        ["job-worker-0.ns.svc:2222"],
    ),
    (
        "worker",
        0,
        "multi_worker_mirrored",
        {"chief": 0, "ps": 0},
        True,
        False,
        2,
        ["job-worker-1.ns.svc:2222"],
    ),
    ("chief", 0, "multi_worker_mirrored", {"ps": 0}, True, False, 2, PS_PEERS[1:3]),
    ("evaluator", 0, "multi_worker_mirrored", {"chief": 0, "ps": 0}, False, True, 2, []),
]


@pytest.mark.parametrize(
    "task_type,index,strategy,counts,chief,evaluator,num_workers,peers",
    OPERATOR,
    ids=[f"{o[2]}-{o[0]}{o[1]}" for o in OPERATOR],
)
def test_operator_format(task_type, index, strategy, counts, chief, evaluator, num_workers, peers):
    info = parse_tf_config(operator_tf_config(task_type, index, **counts))
    validate_for_strategy(info, strategy)
    assert (info.is_chief, info.is_evaluator, info.num_workers) == (chief, evaluator, num_workers)
    assert info.peers() == peers  # the evaluator is never waited for, and waits for nobody
    assert info.address == f"job-{task_type}-{index}.ns.svc:2222"
    assert "evaluator" in info.cluster and "evaluator" not in info.training_cluster
    assert info.training_cluster == {r: a for r, a in info.cluster.items() if r != "evaluator"}
    assert info.num_training_tasks == info.num_tasks - 1
    assert info.environment == "cloud"


def test_evaluator_listed_on_request_only():
    info = parse_tf_config(operator_tf_config("chief", 0))
    assert "job-evaluator-0.ns.svc:2222" not in info.peers()
    assert info.peers(("evaluator",)) == ["job-evaluator-0.ns.svc:2222"]


def test_operator_custom_cluster_domain():
    cluster = {
        "worker": [
            "job-worker-0.ns.svc.cluster.local:2222",
            "job-worker-1.ns.svc.cluster.local:2222",
        ]
    }
    info = parse_tf_config(tf_config(cluster, "worker", 1, environment="cloud"))
    validate_for_strategy(info, "multi_worker_mirrored")
    assert info.peers() == ["job-worker-0.ns.svc.cluster.local:2222"]


ALONE = {"evaluator": ["127.0.0.1:2240"]}


@pytest.mark.parametrize(
    "cluster,strategy",
    [
        (PS, "parameter_server"),
        (ALONE, "parameter_server"),
        (W2, "multi_worker_mirrored"),
        (CW, "multi_worker_mirrored"),
        (ALONE, "multi_worker_mirrored"),
    ],
    ids=["ps-cluster", "ps-itself", "mwms-workers", "mwms-chief", "mwms-itself"],
)
def test_evaluator_in_tensorflow_convention(cluster, strategy):
    """TensorFlow's own convention: the evaluator's TF_CONFIG leaves it out of ``cluster`` or lists it alone."""
    info = parse_tf_config(tf_config(cluster, "evaluator", 0))
    validate_for_strategy(info, strategy)
    assert info.is_evaluator and not info.is_chief
    assert info.peers() == []
    assert info.training_cluster == {r: tuple(a) for r, a in cluster.items() if r != "evaluator"}


def test_evaluator_outside_cluster_has_no_address():
    info = parse_tf_config(tf_config(W2, "evaluator", 0))
    assert info.address == ""
    assert parse_tf_config(json.dumps(info.to_dict())) == info


def test_single_process_strategy_with_an_evaluator_beside_it():
    info = parse_tf_config(tf_config({"chief": ["h:1"], "evaluator": ["h:2"]}, "chief", 0))
    validate_for_strategy(info, "mirrored")  # one training task; the evaluator is not a copy of it
    assert info.num_tasks == 2 and info.num_training_tasks == 1


OPERATOR_BAD = [
    # (id, TF_CONFIG, substrings of the one-line message)
    (
        "two-evaluators",
        tf_config({"worker": ["h:1"], "evaluator": ["h:2", "h:3"]}, "worker"),
        ["2 evaluators", "'h:2'", "'h:3'", "at most one evaluator"],
    ),
    (
        "evaluator-outside-index-1",
        tf_config(W2, "evaluator", 1),
        ["task.index=1", "'evaluator'", "0..0"],
    ),
    (
        "evaluator-outside-no-index",
        json.dumps({"cluster": W2, "task": {"type": "evaluator"}}),
        ['no "index"'],
    ),
    (
        "environment-not-string",
        tf_config(W2, "worker", 0, environment=1),
        ["environment=1", '"cloud"'],
    ),
    (
        "master-role",
        tf_config({"master": ["job-master-0.ns.svc:2222"]}, "master"),
        ["'master'", "chief, worker, ps, evaluator", "Chief replica"],
    ),
    (
        "capitalised-role",
        tf_config({"Worker": ["job-worker-0.ns.svc:2222"]}, "Worker"),
        ["'Worker'", "chief, worker, ps, evaluator"],
    ),
    (
        "sparse-cluster",
        json.dumps(
            {
                "sparseCluster": {"worker": {"1": "job-worker-1.ns.svc:2222"}, "ps": []},
                "task": {"type": "worker", "index": 1},
            }
        ),
        ["'sparseCluster'", "enableDynamicWorker: false"],
    ),
    (
        "hostname-no-port",
        tf_config({"worker": ["job-worker-0.ns.svc"]}),
        ["'job-worker-0.ns.svc'", "no port"],
    ),
    (
        "evaluator-index-out-of-range",
        operator_tf_config("evaluator", 1),
        ["task.index=1", "'evaluator'", "0..0"],
    ),
    (
        "worker-index-out-of-range",
        operator_tf_config("worker", 2),
        ["task.index=2", "'worker'", "2 tasks: 0..1"],
    ),
]


@pytest.mark.parametrize(
    "text,expected", [b[1:] for b in OPERATOR_BAD], ids=[b[0] for b in OPERATOR_BAD]
)
def test_operator_format_rejections(text, expected):
    with pytest.raises(ClusterError) as err:
        parse_tf_config(text)
    message = str(err.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_mwms_refuses_the_operators_ps_for_every_task():
    for task_type, index in [("chief", 0), ("worker", 1), ("evaluator", 0)]:
        with pytest.raises(ClusterError, match="'multi_worker_mirrored'"):
            validate_for_strategy(
                parse_tf_config(operator_tf_config(task_type, index)), "multi_worker_mirrored"
            )


def test_a_job_whose_servers_the_network_can_reach_says_so_once():
    from tfopt.runtime.tf_config import exposure_warning

    local = parse_tf_config(tf_config({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}))
    remote = parse_tf_config(
        tf_config({"chief": ["10.0.0.5:2222"], "worker": ["10.0.0.6:2222"]}, "chief")
    )
    said = exposure_warning(local, {})
    assert (
        "port(s) 2222, 2223 of every network interface (not only 127.0.0.1)" in said
        and "--isolate" in said
    )
    assert "NetworkPolicy" in exposure_warning(remote, {}) and "\n" not in exposure_warning(
        remote, {}
    )
    assert exposure_warning(local, {"TFOPT_ISOLATED": "1"}) is None  # inside tfopt.launch --isolate
    assert exposure_warning(None, {}) is None  # one process: no server
