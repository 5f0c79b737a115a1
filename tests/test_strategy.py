"""Strategy factory and precision policy, in-process on the 2 logical CPUs set up by conftest."""

import json

from tfopt.core._keras import keras, tf

import pytest

from tfopt.config import RuntimeConfig
from tfopt.core.errors import ClusterError, ConfigError
from tfopt.core.specs import STRATEGIES
from tfopt.runtime import precision
from tfopt.runtime.strategy import is_chief, make_strategy, num_replicas, run_server
from tfopt.runtime.tf_config import parse_tf_config

W2 = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
PS = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}


def cluster(spec, task_type="worker", index=0):
    return parse_tf_config(
        json.dumps({"cluster": spec, "task": {"type": task_type, "index": index}})
    )


def test_every_registered_strategy_has_a_factory():
    from tfopt.core.errors import ConfigError
    from tfopt.core.specs import resolve

    for name in STRATEGIES:
        assert callable(resolve(STRATEGIES.get(name).factory)), name
    with pytest.raises(
        ConfigError, match="runtime.strategy='tpu' is not valid; choose one of one_device, mirrored"
    ):
        make_strategy(RuntimeConfig(strategy="tpu"), None)


def test_one_device():
    strategy = make_strategy(RuntimeConfig(strategy="one_device"), None)
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert num_replicas(strategy) == 1
    expected = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    assert strategy.extended.worker_devices[0].endswith(expected)


@pytest.mark.slow
def test_mirrored_uses_two_logical_cpus():
    strategy = make_strategy(RuntimeConfig(strategy="mirrored", cpu_replicas=2), None)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert num_replicas(strategy) == 2
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    assert float(total) == 2.0
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
        model.compile("sgd", "mse")
    model.fit(tf.ones((8, 3)), tf.ones((8, 1)), batch_size=4, epochs=1, verbose=0)


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(
        ConfigError, match=r"'tpu'.*one_device, mirrored, multi_worker_mirrored, parameter_server"
    ):
        make_strategy(RuntimeConfig(strategy="tpu"), None)


def test_single_process_strategy_refuses_multi_task_tf_config():
    with pytest.raises(ClusterError, match="2-task cluster"):
        make_strategy(RuntimeConfig(strategy="mirrored"), cluster(W2))


def test_multi_worker_single_process_without_tf_config():
    strategy = make_strategy(RuntimeConfig(strategy="multi_worker_mirrored"), None)
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert num_replicas(strategy) == 1


def test_multi_worker_after_tf_ops_gives_clear_error():
    tf.constant(1.0) + 1.0  # initializes the eager context, as any earlier TF work would
    with pytest.raises(ClusterError, match="before any other TensorFlow op"):
        make_strategy(RuntimeConfig(strategy="multi_worker_mirrored"), cluster(W2))


@pytest.mark.skipif(
    bool(tf.config.list_physical_devices("GPU")), reason="needs a machine without GPUs"
)
def test_nccl_without_gpus():
    with pytest.raises(ConfigError, match="'nccl'.*auto or ring"):
        make_strategy(
            RuntimeConfig(strategy="multi_worker_mirrored", collective="nccl"), cluster(W2)
        )


def test_parameter_server_worker_must_run_server():
    with pytest.raises(ClusterError, match="run_server"):
        make_strategy(RuntimeConfig(strategy="parameter_server"), cluster(PS, "worker"))


def test_run_server_refuses_chief():
    with pytest.raises(ClusterError, match="task.type='chief'"):
        run_server(cluster(PS, "chief"))


def test_is_chief():
    assert is_chief(None)
    assert is_chief(cluster(W2, "worker", 0)) and not is_chief(cluster(W2, "worker", 1))
    assert is_chief(cluster(PS, "chief")) and not is_chief(cluster(PS, "worker"))


@pytest.fixture
def reset_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("name", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_set_policy(reset_policy, name):
    precision.set_policy(name)
    assert precision.policy_name() == name
    assert keras.mixed_precision.global_policy().name == name


def test_unknown_policy(reset_policy):
    with pytest.raises(ConfigError, match=r"'float16'.*float32, mixed_float16, mixed_bfloat16"):
        precision.set_policy("float16")
    assert precision.policy_name() == "float32"


def test_mixed_bfloat16_dense(reset_policy):
    precision.set_policy("mixed_bfloat16")
    layer = keras.layers.Dense(4)
    logits = keras.layers.Dense(2, dtype="float32")
    hidden = layer(tf.ones((2, 3)))
    assert hidden.dtype == tf.bfloat16
    assert layer.kernel.dtype == tf.float32
    assert logits(hidden).dtype == tf.float32


def test_mixed_float16_compile_adds_loss_scaling(reset_policy):
    precision.set_policy("mixed_float16")
    model = keras.Sequential(
        [keras.layers.Dense(2, input_shape=(3,)), keras.layers.Dense(1, dtype="float32")]
    )
    model.compile(keras.optimizers.SGD(0.1), "mse")
    assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
