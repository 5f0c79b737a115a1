"""What the wheel carries and where the project says it lives."""

import configparser
import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tfopt.core.errors import ConfigError
from tfopt.pipeline import config as pipeline_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GITHUB = re.compile(
    r"(?:github\.com|githubusercontent\.com|colab\.research\.google\.com/github)/([\w.-]+)/([\w.-]+)"
)


def declared_home() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    return cfg["metadata"]["url"]


def test_every_address_of_the_project_is_the_declared_one():
    home = declared_home()
    owner, repo = GITHUB.search(home).groups()
    files = [
        p
        for pattern in ("README.md", "docs/*.md", "pipelines/*", "notebooks/*", "setup.cfg")
        for p in glob.glob(os.path.join(REPO, pattern))
    ]
    seen = []
    for path in files:
        text = open(path, encoding="utf-8").read()
        for o, r in GITHUB.findall(text):
            r = r.removesuffix(".git")
            if "tfopt" in (o + r).lower():
                seen.append((os.path.relpath(path, REPO), o, r))
    assert [s for s in seen if s[1:] != (owner, repo)] == []
    # the notebooks' badges and install cells are among them
    assert sum(s[0].startswith("notebooks") for s in seen) >= 5, seen


def test_examples_are_found_by_name_and_a_missing_file_is_named(tmp_path, monkeypatch):
    assert {"mnist_edge", "fashion_edge", "folder_edge"} <= set(pipeline_config.example_names())
    found = pipeline_config.find_pipeline("mnist_edge")
    assert found == os.path.join(REPO, "pipelines", "mnist_edge.py")
    # an installed copy (the wheel's data files under sys.prefix) is found first
    share = tmp_path / "share" / "tfopt" / "pipelines"
    share.mkdir(parents=True)
    (share / "mine.py").write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert pipeline_config.find_pipeline("mine") == str(share / "mine.py")
    with pytest.raises(ConfigError, match=r"'nope/x\.py': no such file; .* mnist_edge"):
        pipeline_config.find_pipeline("nope/x.py")
    with pytest.raises(ConfigError, match="not a .py file"):
        pipeline_config.find_pipeline("pipelines/mnist_cnn.yaml")
    with pytest.raises(
        ConfigError, match="no example pipeline named 'mnist_egde'; did you mean mnist_edge"
    ):
        pipeline_config.find_pipeline("mnist_egde")


@pytest.mark.slow
def test_the_wheel_carries_the_package_and_the_example_pipelines(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path / "src"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "runs", "build", "*.egg-info", "__pycache__"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = glob.glob(str(tmp_path / "tfopt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "tfopt/pipeline/config.py" in names and "tfopt/core/_keras.py" in names
    for example in ("mnist_edge.py", "fashion_edge.py", "folder_edge.py"):
        assert any(n.endswith(f".data/data/share/tfopt/pipelines/{example}") for n in names), names
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert (
        f"Home-page: {declared_home()}" in text
        or f"Project-URL: Homepage, {declared_home()}" in text
        or declared_home() in text
    )
    assert (
        "Provides-Extra: gpu" in text
        and "Classifier: Programming Language :: Python :: 3.11" in text
    )
