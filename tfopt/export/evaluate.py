"""Running a .tflite with the LiteRT interpreter, and scoring it on held-out data.

``TFLiteModel`` wraps ``ai_edge_litert.interpreter.Interpreter``: it quantizes float inputs with
the input tensor's (scale, zero_point), dequantizes outputs with the output tensor's, and refuses
inputs the interpreter would silently accept (NaN/Inf values, a wrong shape, a non-numeric
dtype). ``evaluate`` reports accuracy, top-1 agreement with the Keras model and the largest
absolute difference between the two models' outputs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass

import numpy as np

from tfopt.core import native_stderr
from tfopt.core.errors import DataError, ModelError
from tfopt.data.pipeline import load_split  # noqa: F401 - tfopt.export's public name


def _interpreter_class():
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter, OpResolverType


def read_tflite(path: str) -> bytes:
    """Reads a .tflite file, checking it exists and looks like a TFLite flatbuffer."""
    if not os.path.isfile(path):
        raise ModelError(f"model {path!r} does not exist; give the path of a .tflite file")
    with open(path, "rb") as f:
        content = f.read()
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise ModelError(
            f"{path!r} is not a TFLite model (no TFL3 identifier); give a .tflite file"
        )
    return content


class TFLiteModel:
    """A .tflite model in the LiteRT interpreter, fed with float data.

    Args:
        model: A path to a .tflite file or the flatbuffer bytes.
        num_threads: Interpreter threads (None = LiteRT's default).
        xnnpack: Use the default XNNPACK delegate (True, LiteRT's default) or only the builtin
            kernels (``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES``).
        latest_features: The interpreter's ``experimental_default_delegate_latest_features``: its
            own XNNPACK delegate with the latest operators and subgraph reshaping.

    Raises:
        ModelError: missing file, not a TFLite model, more than one input or output, or an op
            the interpreter cannot run (e.g. Flex ops without the Flex delegate).
    """

    def __init__(
        self,
        model: str | bytes,
        *,
        num_threads: int | None = None,
        xnnpack: bool = True,
        latest_features: bool = False,
    ):
        content = read_tflite(model) if isinstance(model, str) else bytes(model)
        self.name = model if isinstance(model, str) else "<bytes>"
        self.content = content
        self.num_threads = num_threads
        self.xnnpack = xnnpack
        Interpreter, OpResolverType = _interpreter_class()
        resolver = (
            OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        )
        try:
            with native_stderr.filtered():  # LiteRT announces its XNNPACK delegate on fd 2
                self.interpreter = Interpreter(
                    model_content=content,
                    num_threads=num_threads,
                    experimental_op_resolver_type=resolver,
                    experimental_default_delegate_latest_features=latest_features,
                )
                self.interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as e:
            text = str(e).strip()
            flex = sorted(set(re.findall(r"\((Flex\w+)\)", text)))
            if flex or "Select TensorFlow op" in text:
                raise ModelError(
                    f"{self.name} holds Select TF (Flex) ops ({', '.join(flex) or '?'}) and this "
                    "LiteRT interpreter has no Flex delegate; re-export without "
                    "--allow-select-tf-ops after replacing those layers"
                ) from None
            first = text.splitlines()[0][:200] if text else type(e).__name__
            raise ModelError(
                f"the LiteRT interpreter cannot load {self.name}: {first}; re-export it"
            ) from None
        inputs, outputs = (
            self.interpreter.get_input_details(),
            self.interpreter.get_output_details(),
        )
        if len(inputs) != 1 or len(outputs) != 1:
            raise ModelError(
                f"{self.name} has {len(inputs)} inputs and {len(outputs)} outputs; "
                "tfopt evaluates single-input, single-output classifiers"
            )
        self.input, self.output = inputs[0], outputs[0]
        self._batch = int(self.input["shape"][0])

    @property
    def input_signature(self) -> tuple[int, ...]:
        """The input shape with -1 for a dynamic (batch) dimension."""
        return tuple(int(d) for d in self.input.get("shape_signature", self.input["shape"]))

    @property
    def input_dtype(self) -> np.dtype:
        """The dtype the interpreter's input tensor holds (float32, int8, uint8, ...)."""
        return np.dtype(self.input["dtype"])

    @property
    def output_dtype(self) -> np.dtype:
        """The dtype of the interpreter's output tensor."""
        return np.dtype(self.output["dtype"])

    def quantization(self, which: str = "input") -> tuple[float, int] | None:
        """``(scale, zero_point)`` of the input or output tensor, or None when it is float."""
        detail = self.input if which == "input" else self.output
        if np.issubdtype(np.dtype(detail["dtype"]), np.floating):
            return None
        scale, zero_point = detail["quantization"]
        if scale == 0:
            raise ModelError(
                f"{self.name}: the {which} tensor is {np.dtype(detail['dtype'])} but has no "
                "quantization scale; re-export the model"
            )
        return float(scale), int(zero_point)

    def check_input(self, x) -> np.ndarray:
        """Validates a float input batch; returns it as float32.

        Raises:
            DataError: not an array of numbers, wrong shape, or NaN/Inf values.
        """
        sig = self.input_signature
        expected = "(" + ", ".join("N" if d < 0 else str(d) for d in sig) + ")"
        try:
            arr = np.asarray(x)
        except (
            ValueError,
            TypeError,
        ):  # ragged lists and other objects numpy cannot hold as one array
            raise DataError(
                f"input of type {type(x).__name__} is not an array; give a float array "
                f"of shape {expected}"
            ) from None
        if (
            not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer))
            or arr.dtype == np.bool_
        ):
            raise DataError(
                f"input dtype {arr.dtype} is not numeric; give float32 values of shape {expected} "
                "(images scaled as in training)"
            )
        if (
            arr.ndim != len(sig)
            or any(d >= 0 and d != s for d, s in zip(sig[1:], arr.shape[1:]))
            or (sig[0] >= 0 and arr.shape[0] != sig[0] and sig[0] != 1)
        ):
            raise DataError(
                f"input shape {tuple(arr.shape)} does not match the model's input {expected}; "
                "reshape the data (e.g. add the channel axis)"
            )
        arr = arr.astype(np.float32, copy=False)
        finite = np.isfinite(arr)
        if not finite.all():
            bad = int(arr.size - np.count_nonzero(finite))
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise DataError(
                f"input has {bad} NaN/Inf value(s) (first at index {first}); the interpreter "
                "would return plausible numbers for them: clean or drop those examples"
            )
        return arr

    def quantize_input(
        self, x: np.ndarray, scale: float | None = None, zero_point: int | None = None
    ) -> np.ndarray:
        """Maps float values to the input tensor's type: ``round(x / scale + zero_point)``, clipped.

        ``scale`` / ``zero_point`` default to the tensor's own; passing others exists so that a
        test can prove the right ones matter.
        """
        params = self.quantization("input")
        if params is None:
            return x.astype(self.input_dtype, copy=False)
        scale = params[0] if scale is None else scale
        zero_point = params[1] if zero_point is None else zero_point
        info = np.iinfo(self.input_dtype)
        q = np.round(x / np.float32(scale) + zero_point)
        return np.clip(q, info.min, info.max).astype(self.input_dtype)

    def dequantize_output(self, y: np.ndarray) -> np.ndarray:
        """Maps raw outputs back to float: ``(y - zero_point) * scale``."""
        params = self.quantization("output")
        if params is None:
            return y.astype(np.float32, copy=False)
        scale, zero_point = params
        return ((y.astype(np.float32) - zero_point) * np.float32(scale)).astype(np.float32)

    def _resize(self, n: int) -> None:
        if n != self._batch:
            self.interpreter.resize_tensor_input(
                self.input["index"], [n, *self.input_signature[1:]]
            )
            self.interpreter.allocate_tensors()
            self.input = self.interpreter.get_input_details()[0]
            self.output = self.interpreter.get_output_details()[0]
            self._batch = n

    def invoke_raw(self, q: np.ndarray) -> np.ndarray:
        """Runs one batch already in the input tensor's dtype; returns the raw output."""
        self._resize(q.shape[0])
        self.interpreter.set_tensor(self.input["index"], q)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output["index"])

    def predict(
        self,
        x,
        *,
        batch_size: int = 256,
        input_scale: float | None = None,
        input_zero_point: int | None = None,
    ) -> np.ndarray:
        """Float outputs (dequantized) for a float input batch of any length.

        Raises:
            DataError: see ``check_input``.
        """
        arr = self.check_input(x)
        if self.input_signature[0] >= 0:  # a fixed batch dimension: feed one example at a time
            batch_size = self.input_signature[0]
        outs = []
        for start in range(0, arr.shape[0], batch_size):
            q = self.quantize_input(arr[start : start + batch_size], input_scale, input_zero_point)
            outs.append(self.dequantize_output(self.invoke_raw(q)))
        if not outs:
            raise DataError("input batch is empty; give at least one example")
        return np.concatenate(outs)


@dataclass
class EvalResult:
    """Scores of one .tflite model on one labelled set."""

    examples: int
    accuracy: float
    keras_accuracy: float | None = None
    accuracy_delta_pt: float | None = None  # tflite - keras, in percentage points
    agreement: float | None = None  # fraction of examples with the same top-1 class as Keras
    max_abs_error: float | None = None  # largest |tflite output - keras output|
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON-friendly dict."""
        return dataclasses.asdict(self)


def evaluate(
    model: TFLiteModel,
    x: np.ndarray,
    y: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    batch_size: int = 256,
    input_scale: float | None = None,
    input_zero_point: int | None = None,
) -> EvalResult:
    """Scores ``model`` on ``(x, y)``, and against the Keras outputs ``reference`` when given.

    Args:
        model: The interpreter wrapper.
        x: Float inputs ``[N, ...]``.
        y: Integer labels ``[N]``.
        reference: The Keras model's outputs (logits) for ``x``, ``[N, classes]``.
        batch_size: Examples per interpreter call.
        input_scale: Override of the input scale (tests only; see ``quantize_input``).
        input_zero_point: Override of the input zero point (tests only).

    Raises:
        DataError: bad inputs, or labels/reference that do not match ``x``.
    """
    y = np.asarray(y)
    if y.shape[0] != np.shape(x)[0]:
        raise DataError(
            f"{np.shape(x)[0]} inputs but {y.shape[0]} labels; give one label per example"
        )
    started = time.perf_counter()
    out = model.predict(
        x, batch_size=batch_size, input_scale=input_scale, input_zero_point=input_zero_point
    )
    seconds = time.perf_counter() - started
    pred = out.argmax(axis=-1)
    result = EvalResult(
        examples=int(y.shape[0]), accuracy=float(np.mean(pred == y)), seconds=round(seconds, 3)
    )
    if reference is not None:
        reference = np.asarray(reference, dtype=np.float32)
        if reference.shape != out.shape:
            raise DataError(
                f"reference outputs have shape {reference.shape}, the model gives {out.shape}; "
                "compare models with the same outputs"
            )
        ref_pred = reference.argmax(axis=-1)
        result.keras_accuracy = float(np.mean(ref_pred == y))
        result.accuracy_delta_pt = round(100.0 * (result.accuracy - result.keras_accuracy), 4)
        result.agreement = float(np.mean(pred == ref_pred))
        result.max_abs_error = float(np.max(np.abs(out - reference)))
    return result


def keras_outputs(model, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The Keras model's outputs for ``x`` (inference mode), as float32."""
    outs = [
        np.asarray(model(x[i : i + batch_size], training=False), dtype=np.float32)
        for i in range(0, len(x), batch_size)
    ]
    return np.concatenate(outs)
