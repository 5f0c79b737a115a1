"""One test per entry of tfopt.core._compat: it fails, naming the entry to change or remove, as soon as
upstream changes what the entry relies on (a private name goes, a public one comes, a defect is
fixed). Tiny models only: each test takes seconds.
"""

import ast
import glob
import inspect
import os
import re
import sys
from importlib.metadata import version

from tfopt.core._keras import keras, tf

import numpy as np
import pytest
import tensorflow_model_optimization as tfmot

from tfopt.core import _compat

TFMOT = f"tfmot {version('tensorflow-model-optimization')}"
TF = f"TensorFlow {tf.__version__} / tf_keras {version('tf_keras')}"
_q = tfmot.quantization.keras
_c = tfmot.clustering.keras
_s = tfmot.sparsity.keras


def _dense(policy="float32", units=8, seed=0):
    """Input(8) -> Dense "h" (``policy``) -> Dense "out" (float32 logits)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,), name="x")
    h = keras.layers.Dense(units, dtype=policy, name="h")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4, dtype="float32", name="out")(h), name="tiny")


def _data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8), dtype=np.float32), rng.integers(0, 4, n)


def _still_broken(run, errors, match: str, fixed: str) -> None:
    """Passes when ``run`` still fails with the known error; fails with ``fixed`` when it works."""
    try:
        run()
    except errors as e:
        assert re.search(match, str(e)), (
            f"the known upstream defect now fails differently (re-check {fixed!r}): {e}"
        )
        return
    pytest.fail(fixed)


# -- bookkeeping ---------------------------------------------------------------------------------


def test_every_entry_has_a_test():
    module = sys.modules[__name__]
    sources = "".join(
        inspect.getsource(fn)
        for name, fn in vars(module).items()
        if name.startswith("test_") and name != "test_every_entry_has_a_test"
    )
    missing = [name for name in _compat.__all__ if name not in sources]
    assert not missing, (
        f"tfopt.core._compat entries without a test in tests/test_compat.py: {missing}"
    )


def test_targets_are_the_installed_versions():
    # A new upstream version may fix a defect or drop a private name: re-check every entry then.
    for package, targets in _compat.TARGETS.items():
        installed = version(package)
        assert any(installed.split(".")[: len(t.split("."))] == t.split(".") for t in targets), (
            f"{package} {installed} is installed but tfopt.core._compat targets {', '.join(targets)}: run "
            "tests/test_compat.py, remove the workarounds it reports fixed, then update tfopt.core._compat.TARGETS"
        )


def test_importing_compat_does_not_load_tfmot():
    # Export must not load tfmot for a float model: tfmot is imported inside functions only.
    tree = ast.parse(inspect.getsource(_compat))
    eager = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and "tensorflow_model_optimization" in ast.unparse(node)
    ]
    assert not eager, f"tfopt.core._compat imports tfmot at module level: {eager}"


# -- private APIs ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_tfmot_wrapper_classes_are_still_private():
    public = {"PruneLowMagnitude": _s, "ClusterWeights": _c, "QuantizeLayer": _q}
    for name, module in public.items():
        assert not hasattr(module, name), (
            f"{TFMOT} exports {module.__name__}.{name}: use the public name in tfopt.core._compat "
            "(PRUNE_WRAPPERS / CLUSTER_WRAPPERS / QUANTIZE_LAYERS)"
        )
    model = _dense()
    pruned = _s.prune_low_magnitude(model, pruning_schedule=_s.ConstantSparsity(0.5, 0))
    assert isinstance(pruned.get_layer("prune_low_magnitude_h"), _compat.PRUNE_WRAPPERS)
    clustered = _c.cluster_weights(
        _dense(), number_of_clusters=2, cluster_centroids_init=_c.CentroidInitialization.LINEAR
    )
    assert isinstance(clustered.get_layer("cluster_h"), _compat.CLUSTER_WRAPPERS)
    qat = _q.quantize_model(_dense())
    assert any(isinstance(layer, _compat.QUANTIZE_LAYERS) for layer in qat.layers), (
        f"{TFMOT}: quantize_model no longer adds a QuantizeLayer; update tfopt.core._compat.QUANTIZE_LAYERS"
    )


class _Scale(keras.layers.Layer):
    def build(self, input_shape):
        self.scale = self.add_weight("scale", shape=(), initializer="ones")
        super().build(input_shape)

    def call(self, inputs):
        return inputs * self.scale


def test_tfmot_registries_are_still_private():
    for module, name in ((_s, "PruneRegistry"), (_c, "ClusteringRegistry")):
        assert not hasattr(module, name), (
            f"{TFMOT} exports {module.__name__}.{name}: use it in tfopt.core._compat's registry functions"
        )
    from tensorflow_model_optimization.python.core.clustering.keras.clustering_registry import (
        ClusteringRegistry,
    )
    from tensorflow_model_optimization.python.core.sparsity.keras.prune_registry import (
        PruneRegistry,
    )

    for registry, fn in (
        (PruneRegistry, "prunable_weight_names"),
        (ClusteringRegistry, "clusterable_weight_names"),
    ):
        assert hasattr(registry, "_weight_names"), (
            f"{TFMOT} dropped {registry.__name__}._weight_names: update tfopt.core._compat.{fn}"
        )

    dense, conv, custom = keras.layers.Dense(4), keras.layers.Conv2D(2, 3), _Scale()
    dense.build((None, 8)), conv.build((None, 6, 6, 1)), custom.build((None, 8))
    lstm = keras.layers.LSTM(4)
    lstm.build((None, 3, 8))
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    mha(tf.zeros((1, 3, 8)), tf.zeros((1, 3, 8)))
    assert _compat.prune_registry_supports(dense) and _compat.prune_registry_supports(conv)
    assert not _compat.prune_registry_supports(custom)
    assert (
        _compat.prunable_weight_names(dense) == ["kernel"]
        and _compat.prunable_weight_names(custom) == []
    )
    assert _compat.prunable_weight_names(lstm), (
        "an LSTM has prunable kernels"
    )  # PruneRegistry raises KeyError
    assert _compat.cluster_registry_supports(conv) and not _compat.cluster_registry_supports(custom)
    assert (
        _compat.clusterable_weight_names(conv) == ["kernel"]
        and _compat.clusterable_weight_names(custom) == []
    )
    assert _compat.clusterable_weight_names(lstm) and _compat.clusterable_weight_names(
        mha
    )  # KeyError upstream


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.fc = keras.layers.Dense(2)

    def call(self, inputs):
        return self.fc(inputs)


def test_keras_graph_network_and_keras_history_are_still_private():
    assert not hasattr(keras.models, "Functional"), (
        f"{TF} exports keras.models.Functional: use isinstance in tfopt.core._compat.is_graph_network"
    )
    model = _dense()
    sequential = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    subclassed = _Subclassed()
    subclassed(tf.zeros((1, 8)))
    assert _compat.is_graph_network(model) and _compat.is_graph_network(sequential), (
        f"{TF} changed Model._is_graph_network: update tfopt.core._compat.is_graph_network"
    )
    assert not _compat.is_graph_network(subclassed)
    assert [_compat.producing_layer(t).name for t in model.outputs] == ["out"], (
        f"{TF} changed KerasTensor._keras_history: update tfopt.core._compat.producing_layer"
    )
    out = model.get_layer("out")
    other = keras.Model(
        other_input := keras.Input(out.input_shape[1:]), out(other_input)
    )  # a second call
    assert _compat.model_node_indices(model, out) == [0] and _compat.model_node_indices(
        other, out
    ) == [1], (
        f"{TF} changed Functional._network_nodes: update tfopt.core._compat.model_node_indices"
    )


def test_freezing_variables_has_no_public_api():
    assert not hasattr(tf.graph_util, "convert_variables_to_constants_v2"), (
        f"{TF} exports tf.graph_util.convert_variables_to_constants_v2: import it publicly in tfopt.core._compat"
    )
    var = tf.Variable(2.0)
    fn = tf.function(lambda x: x * var).get_concrete_function(tf.TensorSpec([1], tf.float32))
    frozen = _compat.convert_variables_to_constants_v2(fn)
    ops = {op.type for op in frozen.graph.get_operations()}
    assert "ReadVariableOp" not in ops and np.ravel(frozen(tf.constant([3.0]))).tolist() == [6.0]


def test_converter_error_is_still_private():
    assert not [n for n in dir(tf.lite) if n.endswith("Error")], (
        f"{TF} exports a converter error from tf.lite: import it publicly in tfopt.core._compat.ConverterError"
    )
    fn = tf.function(lambda x: tf.linalg.det(x)).get_concrete_function(
        tf.TensorSpec([2, 2], tf.float32)
    )
    with pytest.raises(_compat.ConverterError):  # no builtin kernel for the determinant
        tf.lite.TFLiteConverter.from_concrete_functions([fn], fn).convert()


def test_litert_ops_details_is_still_private():
    from ai_edge_litert.interpreter import Interpreter

    assert not hasattr(Interpreter, "get_ops_details"), (
        f"ai-edge-litert {version('ai-edge-litert')} has a public Interpreter.get_ops_details: use it in "
        "tfopt.core._compat.interpreter_ops_details"
    )
    fn = tf.function(lambda x: tf.nn.relu(x) + 1.0).get_concrete_function(
        tf.TensorSpec([1, 4], tf.float32)
    )
    content = tf.lite.TFLiteConverter.from_concrete_functions([fn], fn).convert()
    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    ops = _compat.interpreter_ops_details(interpreter)
    assert ops and {"op_name", "index", "inputs", "outputs"} <= set(ops[0]), (
        "LiteRT changed Interpreter._get_ops_details: update tfopt.core._compat.interpreter_ops_details"
    )


def test_litert_signature_invoke_is_still_private():
    from ai_edge_litert.interpreter import Interpreter

    def double(x):
        return {"y": x * 2.0}

    def triple(x):
        return {"y": x * 3.0}

    spec = tf.TensorSpec([1, 4], tf.float32, name="x")
    fns = [tf.function(f).get_concrete_function(spec) for f in (double, triple)]
    interpreter = Interpreter(
        model_content=tf.lite.TFLiteConverter.from_concrete_functions(fns, tf.Module()).convert()
    )
    runner = interpreter.get_signature_runner("triple")
    assert not hasattr(runner, "invoke"), (
        "LiteRT's SignatureRunner has a public invoke(): use it in tfopt.core._compat.signature_invoker"
    )
    runner(x=np.ones((1, 4), np.float32))
    runner._interpreter_wrapper.SetTensor(
        runner._inputs["x"], np.full((1, 4), 2.0, np.float32), runner._subgraph_index
    )
    _compat.signature_invoker(runner)()  # the bare invoke of that one subgraph
    out = runner._interpreter_wrapper.GetTensor(dict(runner._outputs)["y"], runner._subgraph_index)
    assert out.tolist() == [[6.0] * 4], (
        "LiteRT changed SignatureRunner: update tfopt.core._compat.signature_invoker"
    )


def test_tflite_schema_module_still_has_the_names_tfopt_reads():
    schema = _compat.tflite_schema()
    codes = schema.BuiltinOperator
    assert (codes.CONV_2D, codes.DEPTHWISE_CONV_2D, codes.FULLY_CONNECTED) == (3, 4, 9), (
        "the TFLite schema renumbered its ops: re-check tfopt.export.ops"
    )
    assert schema.BufferT().data is None and hasattr(schema, "ModelT")


def test_tflite_model_editing_is_still_private():
    import ai_edge_litert
    from ai_edge_litert.interpreter import Interpreter

    public = [
        n
        for n in dir(ai_edge_litert) + dir(tf.lite) + dir(tf.lite.experimental)
        if re.search(r"strip|flatbuffer|read_model", n, re.I)
    ]
    assert not public, (
        f"LiteRT / tf.lite now export {public}: use them in tfopt.core._compat.read_tflite_model / "
        "write_tflite_model"
    )
    fn = tf.function(lambda x: tf.nn.relu(x) * 2.0).get_concrete_function(
        tf.TensorSpec([1, 4], tf.float32)
    )
    content = tf.lite.TFLiteConverter.from_concrete_functions([fn], fn).convert()
    model = _compat.read_tflite_model(content)
    names = [t.name for t in model.subgraphs[0].tensors]
    assert all(isinstance(n, bytes) for n in names) and any(names), (
        "LiteRT changed flatbuffer_utils' object model: update tfopt.core._compat.read_tflite_model"
    )
    for t in model.subgraphs[0].tensors:
        t.name = None
    again = _compat.write_tflite_model(model)
    assert again[4:8] == b"TFL3" and len(again) < len(content), (
        "update tfopt.core._compat.write_tflite_model"
    )
    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    outs = []
    for blob in (content, again):
        interpreter = Interpreter(model_content=blob)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        outs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[1], [[0.0, 1.0, 4.0, 0.0]])


# -- QAT models and the .keras format --------------------------------------------------------------


def _qat_model():
    model = _q.quantize_model(_dense())
    x, _ = _data(4)
    model(x, training=True)  # learn activation ranges, so a reload that loses them shows
    return model, x


@pytest.mark.slow
def test_qat_model_still_does_not_reload_from_keras_format(tmp_path):
    model, x = _qat_model()
    expected = model.predict(x, verbose=0)
    path = str(tmp_path / "qat.keras")
    model.save(path)

    def reload_identical():
        with _q.quantize_scope():
            reloaded = keras.models.load_model(path)
        if not np.allclose(reloaded.predict(x, verbose=0), expected):
            raise ValueError("reloaded with different outputs")

    _still_broken(
        reload_identical,
        ValueError,
        "expected .* variables|different outputs",
        f"upstream fixed QAT models reloading from .keras in {TFMOT} "
        "(model-optimization#1123): remove tfopt.core._compat.fix_for_keras_format",
    )


def test_quantize_layer_still_builds_twice_on_reload():
    model, _ = _qat_model()
    layer = next(layer for layer in model.layers if isinstance(layer, _compat.QUANTIZE_LAYERS))
    with _q.quantize_scope():
        clone = type(layer).from_config(layer.get_config())
    clone.build_from_config({"input_shape": (None, 8)})  # what a .keras reload does first
    clone(tf.zeros((1, 8)))
    assert len(clone.weights) > len(layer.weights), (
        f"upstream fixed QuantizeLayer building twice in {TFMOT}: remove the QuantizeLayer branch of "
        "tfopt.core._compat.fix_for_keras_format"
    )


def test_quantize_wrapper_still_lists_weights_twice():
    model, _ = _qat_model()
    wrapper = next(layer for layer in model.layers if isinstance(layer, _q.QuantizeWrapper))
    ids = [id(w) for w in wrapper._trainable_weights]
    assert len(ids) > len(set(ids)), (
        f"upstream fixed QuantizeWrapperV2 listing the quantized kernel twice in {TFMOT}: remove the "
        "QuantizeWrapper branch of tfopt.core._compat.fix_for_keras_format"
    )


@pytest.mark.slow
def test_fix_for_keras_format_reloads_identically(tmp_path):
    model, x = _qat_model()
    expected = model.predict(x, verbose=0)
    _compat.fix_for_keras_format(model)
    path = str(tmp_path / "qat.keras")
    model.save(path)
    with _q.quantize_scope():
        reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(reloaded.predict(x, verbose=0), expected)
    assert len(reloaded.weights) == len(model.weights)


# -- ClusteringSummaries step counting ------------------------------------------------------------


def _summary_steps(log_dir: str) -> list[int]:
    steps = set()
    for path in glob.glob(os.path.join(log_dir, "**", "events.out*"), recursive=True):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            if any(v.tag.startswith("clustering/") for v in event.summary.value):
                steps.add(int(event.step))
    return sorted(steps)


def _fit_clustered(callback, steps_per_execution: int, batch_hooks: bool) -> None:
    """2 epochs of 4 steps; ``batch_hooks``: another callback makes Keras call batch hooks (e.g. a progress bar)."""
    model = _c.cluster_weights(
        _dense(), number_of_clusters=2, cluster_centroids_init=_c.CentroidInitialization.LINEAR
    )
    model.compile(
        "sgd",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    x, y = _data(16)
    callbacks = [callback] + (
        [keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, l: None)]
        if batch_hooks
        else []
    )
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=callbacks)


@pytest.mark.slow
def test_clustering_summaries_still_assert_under_steps_per_execution(tmp_path):
    _still_broken(
        lambda: _fit_clustered(_c.ClusteringSummaries(log_dir=str(tmp_path)), 2, batch_hooks=True),
        AssertionError,
        "Continuous batch count",
        f"upstream fixed ClusteringSummaries under steps_per_execution > 1 in {TFMOT}: "
        "remove tfopt.core._compat.StepCountingClusteringSummaries if the next test fails too",
    )


@pytest.mark.slow
def test_clustering_summaries_still_write_every_epoch_at_step_0(tmp_path):
    _fit_clustered(_c.ClusteringSummaries(log_dir=str(tmp_path)), 1, batch_hooks=False)
    assert _summary_steps(str(tmp_path)) == [0], (
        f"upstream fixed ClusteringSummaries' step count without batch hooks in {TFMOT}: remove "
        "tfopt.core._compat.StepCountingClusteringSummaries if the previous test fails too"
    )


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_execution,batch_hooks", [(2, True), (2, False), (1, True)])
def test_step_counting_clustering_summaries_write_at_the_right_steps(
    tmp_path, steps_per_execution, batch_hooks
):
    _fit_clustered(
        _compat.StepCountingClusteringSummaries(str(tmp_path)), steps_per_execution, batch_hooks
    )
    assert _summary_steps(str(tmp_path)) == [4, 8]  # the end of each epoch of 4 steps


# -- mixed precision -------------------------------------------------------------------------------


def test_float32_global_policy_restores_the_policy_and_tfmot_layer_dtype():
    assert _compat.tfmot_layer_dtype("float32") is None
    assert (
        _compat.tfmot_layer_dtype("mixed_bfloat16")
        == _compat.tfmot_layer_dtype("mixed_float16")
        == "float32"
    )
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with pytest.raises(RuntimeError):
            with _compat.float32_global_policy():
                assert keras.mixed_precision.global_policy().name == "float32"
                raise RuntimeError("restored even on error")
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.mark.slow
def test_pruning_still_fails_in_a_mixed_dtype_under_mirrored_strategy():
    devices = tf.config.list_logical_devices("CPU")
    if len(devices) < 2:
        pytest.skip("needs 2 logical CPU devices (tests/conftest.py sets them up)")
    strategy = tf.distribute.MirroredStrategy([d.name for d in devices[:2]])
    policy = "mixed_bfloat16"

    def fit():
        with strategy.scope():
            model = _dense(policy)
            schedule = _s.ConstantSparsity(0.5, begin_step=0, frequency=1)
            wrapped = keras.models.clone_model(
                model,
                clone_function=lambda layer: (
                    _s.prune_low_magnitude(layer, pruning_schedule=schedule, dtype=policy)
                    if layer.name == "h"
                    else layer
                ),
            )
            wrapped.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x, y = _data(16)
        wrapped.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[_s.UpdatePruningStep()])

    _still_broken(
        fit,
        ValueError,
        "Tensor conversion requested dtype float32",
        f"upstream fixed pruning in a mixed dtype under MirroredStrategy in {TFMOT} "
        "(model-optimization#409): pruning no longer needs tfopt.core._compat.tfmot_layer_dtype",
    )


def test_clustering_still_fails_in_a_mixed_dtype():
    from tfopt.compress.cluster import INITS

    policy = "mixed_bfloat16"
    working = []
    for name, init in INITS.items():
        try:
            _c.cluster_weights(
                _dense(policy, units=16),
                number_of_clusters=4,
                cluster_centroids_init=init,
                dtype=policy,
            )
        except tf.errors.InvalidArgumentError as e:
            assert "bfloat16" in str(e), f"clustering in bfloat16 now fails differently: {e}"
        else:
            working.append(name)
    assert not working, (
        f"upstream fixed clustering in a mixed dtype in {TFMOT} for centroid init {working}: clustering "
        "needs tfopt.core._compat.tfmot_layer_dtype only for the others (none left: drop it for clustering)"
    )


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_qat_still_fails_under_a_mixed_global_policy(policy):
    previous = keras.mixed_precision.global_policy().name

    def quantize():
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = _q.quantize_model(_dense(policy))
            model(_data(2)[0], training=True)
        finally:
            keras.mixed_precision.set_global_policy(previous)

    _still_broken(
        quantize,
        (TypeError, ValueError, tf.errors.InvalidArgumentError),
        ".",
        f"upstream fixed QAT under {policy} in {TFMOT} (model-optimization#367): remove "
        "tfopt.core._compat.float32_global_policy",
    )
    dtype = tf.bfloat16 if policy == "mixed_bfloat16" else tf.float16
    _still_broken(
        lambda: tf.quantization.fake_quant_with_min_max_vars(tf.ones((2, 2), dtype), -6.0, 6.0),
        tf.errors.InvalidArgumentError,
        "FakeQuantWithMinMaxVars",
        f"{TF} has {dtype.name} fake-quantization kernels (tensorflow#51857): QAT may no longer need "
        "tfopt.core._compat.float32_global_policy",
    )


def test_fit_resumes_at_starts_mid_epoch_and_fit_still_has_no_public_way():
    assert "initial_step" not in inspect.signature(keras.Model.fit).parameters  # else use it
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: seen.append(batch),
        on_epoch_begin=lambda epoch, logs: seen.append(f"e{epoch}"),
    )
    with _compat.fit_resumes_at(model, 1, 3):
        model.fit(data, epochs=3, steps_per_epoch=5, verbose=0, callbacks=[record])
    assert seen == [
        "e1",
        3,
        4,
        "e2",
        0,
        1,
        2,
        3,
        4,
    ]  # epoch 1 from its step 3 on, then epoch 2 whole
    assert int(model.optimizer.iterations) == 7 and model._training_state is None


def _compiled(distiller: bool):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    if distiller:
        from tfopt.models.distiller import Distiller

        model = Distiller(model, [keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])])
        model.compile(optimizer="adam", steps_per_execution=2)
    else:
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=2,
        )
    return model


def _traces(prebuilt: bool, distiller: bool = False) -> tuple[int, int, np.ndarray]:
    """(train traces of 4 Adam steps, test traces of an evaluate of another model, trained weights)."""
    x = np.random.RandomState(0).rand(16, 3).astype("float32")
    y = np.arange(16) % 4
    trained, evaluated = _compiled(distiller), _compiled(distiller)
    for model in (trained, evaluated) if prebuilt else ():
        _compat.build_step_state(model, predictions=getattr(model, "step_predictions", None))
    trained.fit(x, y, batch_size=4, epochs=1, verbose=0)
    evaluated.evaluate(x, y, batch_size=4, verbose=0)
    weights = (trained.student if distiller else trained).get_weights()[0]
    return (
        trained.train_function.experimental_get_tracing_count(),
        evaluated.test_function.experimental_get_tracing_count(),
        weights,
    )


def test_build_step_state_leaves_a_model_whose_variables_do_not_exist_yet_to_keras():
    model = _Subclassed()  # its Dense is built at the first call
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    _compat.build_step_state(model)
    assert [v.name for v in model.optimizer.variables] == [
        "iteration:0"
    ]  # no slots: not built on no variables
    model.fit(
        np.ones((8, 3), "float32"), np.zeros(8), batch_size=4, verbose=0
    )  # Keras builds it in the step
    assert len(model.optimizer.variables) > 1


@pytest.mark.slow
@pytest.mark.parametrize("distiller", [False, True], ids=["model", "distiller"])
def test_build_step_state_traces_each_step_once_where_keras_traces_it_twice(distiller):
    *keras_traces, keras_weights = _traces(prebuilt=False, distiller=distiller)
    *ours, our_weights = _traces(prebuilt=True, distiller=distiller)
    assert keras_traces == [2, 2], (
        "tf_keras no longer traces a first step twice: remove build_step_state"
    )
    assert ours == [1, 1]
    np.testing.assert_array_equal(
        our_weights, keras_weights
    )  # the same training, slots made earlier


def test_random_generators_hold_dropout_state_the_model_checkpoint_lacks(tmp_path):
    keras.backend.experimental.enable_tf_random_generator()
    try:
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dropout(0.5, seed=1)])
        generators = _compat.random_generators(model)
        assert len(generators) == 1
        x = tf.ones((1, 64))
        model(x, training=True)
        tf.train.Checkpoint(model=model, rng=generators[0]).write(str(tmp_path / "with"))
        plain = tf.train.Checkpoint(model=model).write(str(tmp_path / "plain"))
        # Still untracked by the model: its own checkpoint has no generator state.
        assert not [
            n
            for n, _ in tf.train.list_variables(plain)
            if "generator" in n.lower() or "state" in n.lower()
        ]
        expected = model(x, training=True).numpy()
        model(x, training=True)  # advance the state
        tf.train.Checkpoint(model=model, rng=generators[0]).read(str(tmp_path / "with"))
        np.testing.assert_array_equal(model(x, training=True).numpy(), expected)
    finally:
        keras.backend.experimental.disable_tf_random_generator()


def test_accept_remote_logs_is_what_lets_batch_hooks_run_under_parameter_servers():
    class Hook(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    hook = Hook()
    assert hook._supports_tf_logs is False  # reset by Callback.__init__: set it afterwards
    _compat.accept_remote_logs(hook)
    assert hook._supports_tf_logs is True
    import tf_keras.src.callbacks as callbacks_module

    source = inspect.getsource(callbacks_module.CallbackList._disallow_batch_hooks_in_ps_strategy)
    assert '"_supports_tf_logs"' in source  # the exemption the refusal still checks


@pytest.mark.slow
def test_a_keras_model_saved_once_converts_byte_for_byte_as_from_keras_model_does(tmp_path):
    # Written once without the layer traces (save_for_converter), as tfopt converts every model.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 1))
    x = keras.layers.Conv2D(2, 3, activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(keras.layers.DepthwiseConv2D(3, padding="same")(x))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(x)))
    data = [np.random.default_rng(i).random((2, 6, 6, 1), dtype=np.float32) for i in range(2)]
    for name, m in (("float", model), ("qat", _quantize_model(model))):
        path = str(tmp_path / name)
        _compat.save_for_converter(m, path)
        for optimize in (False, True) if name == "float" else (True,):
            ours, public = (
                _compat.saved_model_converter(path),
                tf.lite.TFLiteConverter.from_keras_model(m),
            )
            for c in (ours, public):
                if optimize:
                    c.optimizations = [tf.lite.Optimize.DEFAULT]
                    c.representative_dataset = lambda: ([x] for x in data)
            assert ours.convert() == public.convert(), (
                f"{TF} converts a {name} Keras model differently from its SavedModel: fix or "
                "remove tfopt.core._compat.save_for_converter and saved_model_converter (and "
                "tfopt.export.converter.saved_models)"
            )


def _quantize_model(model):
    import tensorflow_model_optimization as tfmot

    return tfmot.quantization.keras.quantize_model(model)


def test_keras_saved_model_metadata_decodes_every_node_of_a_tf_keras_savedmodel(tmp_path):
    import json

    inp = keras.Input((4,))
    keras.Model(inp, keras.layers.Dense(2, name="fc")(inp), name="m").save(
        str(tmp_path / "sm"), save_format="tf"
    )
    nodes = _compat.keras_saved_model_metadata(str(tmp_path / "sm"))
    parsed = {path: json.loads(meta) for path, meta in nodes if meta}
    assert parsed["root"]["class_name"] == "Functional" and parsed["root"]["name"] == "m"
    assert any(m.get("class_name") == "Dense" and m.get("name") == "fc" for m in parsed.values())


def test_modify_model_io_type_is_still_private_and_gives_integer_io():
    from ai_edge_litert.interpreter import Interpreter

    assert not hasattr(tf.lite, "modify_model_io_type") and not hasattr(
        tf.lite.experimental, "modify_model_io_type"
    ), "tf.lite exports modify_model_io_type: use it in tfopt.core._compat"
    converter = tf.lite.TFLiteConverter.from_keras_model(_dense())
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([x[None]] for x in _data()[0])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    content = converter.convert()  # float I/O, int8 inside
    for dtype, expected in ((tf.int8, np.int8), (tf.uint8, np.uint8)):
        interpreter = Interpreter(model_content=_compat.modify_model_io_type(content, dtype))
        assert interpreter.get_input_details()[0]["dtype"] == expected
        assert interpreter.get_output_details()[0]["dtype"] == expected


def test_parameter_server_workers_reads_what_is_still_private():
    # The real thing runs under every parameter_server test (test_train.py, test_fault_tolerance.py);
    # here: ParameterServerStrategyV2 still keeps both in private attributes, and defines no public
    # property of its own that would return its resolver.
    cls = tf.distribute.experimental.ParameterServerStrategy
    source = inspect.getsource(sys.modules[cls.__module__])
    assert "self._cluster_resolver =" in source and "self._num_workers =" in source
    assert "cluster_resolver" not in vars(cls), (
        "ParameterServerStrategy has its own cluster_resolver: use it in tfopt.core._compat.parameter_server_workers"
    )


def test_sharded_container_reads_what_is_still_private():
    # The real thing runs in tests/test_sharding.py (a real parameter-server cluster); here:
    # TensorFlow still links each shard to its ShardedVariable only by a private weak reference.
    from tensorflow.python.distribute import sharded_variable

    source = inspect.getsource(sharded_variable)
    assert "v._sharded_container = weakref.ref(self)" in source, (
        "ShardedVariable no longer sets _sharded_container: update tfopt.core._compat.sharded_container"
    )
    from tfopt.core._compat import sharded_container

    assert sharded_container(tf.Variable(1.0)) is None
