"""The documentation site (mkdocs.yml: the guides and the API reference) builds without a warning."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mkdocs_build_strict(tmp_path):
    exe = shutil.which("mkdocs", path=os.path.dirname(sys.executable)) or shutil.which("mkdocs")
    assert exe, "mkdocs is not installed: pip install -e '.[docs]'"
    proc = subprocess.run(
        [exe, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "site" / "api" / "index.html", encoding="utf-8") as f:
        api = f.read()
    # The reference is rendered from the docstrings, not left as `::: module` lines.
    assert ":::" not in api and "Distiller" in api and "run_pipeline" in api


def test_every_guide_is_in_the_site_navigation():
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = yaml.safe_load(f)["nav"]
    listed = {page for entry in nav for page in entry.values()}
    guides = {name for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")}
    assert guides - listed == set(), "add them to mkdocs.yml's nav"
