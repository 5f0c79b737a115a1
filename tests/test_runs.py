import json

import pytest

from tfopt import config as C
from tfopt.core.errors import ConfigError
from tfopt.runs import load_run


def test_load_run_reads_config_and_record(tmp_path):
    cfg = C.from_dict({"runtime": {"strategy": "one_device"}, "train": {"epochs": 2}})
    (tmp_path / "run.json").write_text(
        json.dumps({"config": cfg.to_dict(), "metrics": {"test_accuracy": 0.9}})
    )
    (tmp_path / "model.keras").write_bytes(b"")
    run = load_run(str(tmp_path))
    assert run.config == cfg and run.record.metrics["test_accuracy"] == 0.9


def test_load_run_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a tfopt run directory"):
        load_run(str(tmp_path))
    (tmp_path / "run.json").write_text("{broken")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_run(str(tmp_path))
    (tmp_path / "run.json").write_text(json.dumps({"config": {}}))
    with pytest.raises(ConfigError, match="run without model.keras"):
        load_run(str(tmp_path))
