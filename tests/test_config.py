import dataclasses
import json

import pytest

from tfopt import config as C
from tfopt.core.errors import ConfigError


def test_defaults_are_valid_and_frozen():
    cfg = C.from_dict({})
    assert cfg.runtime.strategy == "mirrored" and cfg.data.dataset == "mnist"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data.dataset = "x"


def test_yaml_and_json_load(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("data:\n  global_batch_size: 64\nruntime:\n  strategy: one_device\n")
    cfg = C.load(str(y))
    assert cfg.data.global_batch_size == 64 and cfg.runtime.strategy == "one_device"
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"train": {"epochs": 2, "learning_rate": 0.01}}))
    cfg = C.load(str(j))
    assert cfg.train.epochs == 2 and cfg.train.learning_rate == 0.01


def test_shipped_pipeline_config_loads():
    cfg = C.load("pipelines/mnist_cnn.yaml")
    assert cfg.runtime.strategy == "mirrored" and cfg.model.name == "cnn"


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"data": {"batch": 3}}, "valid keys in 'data': dataset"),
        ({"dat": {}}, "valid sections: data, model, runtime, train"),
        (
            {"runtime": {"strategy": "tpu"}},
            "'tpu' is not valid; choose one of one_device, mirrored",
        ),
        ({"runtime": {"precision": "fp8"}}, "choose one of float32, mixed_float16, mixed_bfloat16"),
        ({"data": {"global_batch_size": "many"}}, "data.global_batch_size='many' is not an int"),
        ({"data": {"global_batch_size": 0}}, "must be >= 1"),
        ({"data": {"num_parallel_calls": 0}}, "-1 for AUTOTUNE"),
        ({"data": {"deterministic": "maybe"}}, "not a boolean"),
        ({"train": {"epochs": 2.5}}, "not a whole number"),
        ({"model": {"dropout": 1.5}}, "model.dropout=1.5"),
        ({"data": "mnist"}, "must be a mapping"),
        ({"train": {"learning_rate": "nan"}}, "train.learning_rate='nan' is not a finite number"),
        (
            {"train": {"learning_rate": float("inf")}},
            "train.learning_rate=inf is not a finite number",
        ),
        (
            {"runtime": {"startup_timeout": "nan"}},
            "runtime.startup_timeout='nan' is not a finite number",
        ),
        ({"runtime": {"startup_timeout": 0}}, "runtime.startup_timeout=0.0 must be > 0 seconds"),
        ({"data": {"seed": -1}}, "data.seed=-1 must be in [0, 2**32)"),
        ({"train": {"seed": 2**40}}, "train.seed=1099511627776 must be in [0, 2**32)"),
        ({"train": {"epochs": "1e999"}}, "train.epochs='1e999' is not an int"),
    ],
)
def test_bad_values_name_value_and_choices(raw, needle):
    with pytest.raises(ConfigError) as e:
        C.from_dict(raw)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        C.load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot be parsed"):
        C.load(str(bad))
    txt = tmp_path / "c.txt"
    txt.write_text("{}")
    with pytest.raises(ConfigError, match="must end in .yaml"):
        C.load(str(txt))


def test_overrides_win_and_are_typed():
    cfg = C.apply_overrides(
        C.RunConfig(), ["data.cache=none", "train.epochs=7", "data.deterministic=true"]
    )
    assert cfg.data.cache == "none" and cfg.train.epochs == 7 and cfg.data.deterministic is True
    with pytest.raises(ConfigError, match="section.key=value"):
        C.apply_overrides(C.RunConfig(), ["epochs=3"])
