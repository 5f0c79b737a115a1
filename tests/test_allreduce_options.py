"""``--allreduce-dtype bfloat16`` (gradients summed as bfloat16) and ``--bytes-per-pack``."""

import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from isolation import ISOLATED

from tfopt import config as C
from tfopt.core.errors import ConfigError


def test_compressed_aggregation_rounds_each_gradient_to_bfloat16_and_back():
    from tfopt.core._keras import keras, tf

    from tfopt.runtime.job import compress_allreduce

    opt = keras.optimizers.Adam()
    compress_allreduce(opt, "bfloat16")
    variables = [tf.Variable(np.zeros(3, np.float32)), tf.Variable(np.zeros(2, np.float32))]
    grad = np.array([1.0 + 2**-10, 3.14159265, -1e-3], np.float32)  # not bfloat16 numbers
    out = opt.aggregate_gradients([(tf.constant(grad), variables[0]), (None, variables[1])])
    assert out[1] == (None, variables[1])
    summed, var = out[0]
    assert var is variables[0] and summed.dtype == tf.float32
    reference = grad.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(summed.numpy(), reference)
    assert not np.array_equal(reference, grad)  # the test would see an uncompressed sum
    # A plain optimizer keeps the float32 values.
    plain = keras.optimizers.Adam().aggregate_gradients([(tf.constant(grad), variables[0])])
    np.testing.assert_array_equal(plain[0][0].numpy(), grad)


@pytest.mark.parametrize(
    "runtime, message",
    [
        (
            {"strategy": "mirrored", "bytes_per_pack": 4096},
            "runtime.bytes_per_pack=4096 splits the all-reduce of strategy 'multi_worker_mirrored'",
        ),
        (
            {"strategy": "one_device", "allreduce_dtype": "bfloat16"},
            "runtime.allreduce_dtype='bfloat16' compresses the gradients' all-reduce, which only",
        ),
        (
            {"strategy": "parameter_server", "allreduce_dtype": "bfloat16"},
            "use one of them, or drop --allreduce-dtype",
        ),
        ({"allreduce_dtype": "float16"}, "runtime.allreduce_dtype='float16' is not valid"),
        (
            {"strategy": "multi_worker_mirrored", "bytes_per_pack": -1},
            "runtime.bytes_per_pack must be >= 0",
        ),
    ],
)
def test_settings_a_strategy_does_not_use_are_refused_in_one_line(runtime, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        C.from_dict({"runtime": runtime})


def _launch(out, *flags):
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        "--workers",
        "2",
        "--timeout",
        "300",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        "multi_worker_mirrored",
        "--dataset",
        "mnist",
        "--limit",
        "1024",
        "--epochs",
        "1",
        "--model",
        "mlp",
        "--deterministic",
        *flags,
        "-o",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    digests = dict(re.findall(r'"task": "(worker:\d)", "weights_sha256": "(\w+)"', proc.stdout))
    assert len(digests) == 2 and len(set(digests.values())) == 1, digests  # one model
    accuracy = float(re.search(r'"test_accuracy": ([\d.]+)', proc.stdout)[1])
    return digests["worker:0"], accuracy


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_packing_keeps_the_sums_and_bfloat16_changes_them_a_little(tmp_path):
    reference, ref_acc = _launch(tmp_path / "float32")
    packed, _ = _launch(tmp_path / "packed", "--bytes-per-pack", "65536")
    compressed, acc = _launch(tmp_path / "bf16", "--allreduce-dtype", "bfloat16")
    print(f"\nfloat32 all-reduce: accuracy {ref_acc:.4f}; bfloat16: {acc:.4f}")
    assert packed == reference, "packing the all-reduce changed the weights"
    assert compressed != reference, "--allreduce-dtype bfloat16 left the all-reduce in float32"
    assert abs(acc - ref_acc) <= 0.03
