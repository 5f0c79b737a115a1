"""The report of a real pipeline run, rendered in headless Chromium: every image decodes, every table
is there with rows, the page logs no error; a full-page screenshot is kept for a human to look at.

The run is ``pipeline_run`` (conftest: the smoke ``mnist_edge`` pipeline). ``TFOPT_REPORT_RUN=DIR``
uses an existing pipeline run directory instead (it is copied, never modified);
``TFOPT_REPORT_SCREENSHOT=FILE.png`` also saves the screenshot there.
"""

import os
import shutil
import time

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def report_run(request, tmp_path_factory):
    """A copy of a finished pipeline run directory (the report is rebuilt in the copy)."""
    source = os.environ.get("TFOPT_REPORT_RUN")
    if not source:
        value = request.getfixturevalue("pipeline_run")
        source = value["run"] if isinstance(value, dict) else value
    copy = tmp_path_factory.mktemp("report-browser") / "run"
    shutil.copytree(
        source,
        copy,
        symlinks=True,
        ignore=shutil.ignore_patterns("report", "tensorboard", "saved_model"),
    )
    return str(copy)


def expected_tables(report: dict) -> list[str]:
    """The ids of the tables a report must show with at least one row."""
    ids = ["b8", "variants", "selection", "stages", "environment"]
    if report.get("probe"):
        ids.append("probe")
    if report["selection"]["chosen"]:
        ids.append("ops")
    if report["quantization_debugger"]:
        ids += ["debugger", "debugger-trials"]
    return ids


def check_in_browser(html_path: str, tables: list[str], screenshot: str) -> dict:
    """Opens ``html_path`` in headless Chromium; returns images, table row counts, console errors."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on(
                "console",
                lambda m: (
                    errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url[:80]}"))
            page.goto("file://" + os.path.abspath(html_path), wait_until="load")
            page.wait_for_function(
                "Array.from(document.images).every(i => i.complete)", timeout=15000
            )
            images = page.evaluate(
                "Array.from(document.images).map(i => ({w: i.naturalWidth, h: i.naturalHeight,"
                " src: i.src.slice(0, 22)}))"
            )
            count_rows = (
                "id => { const t = document.getElementById(id); if (!t) return -1;"
                " return Array.from(t.querySelectorAll('tbody tr'))"
                ".filter(r => !r.textContent.includes('(no rows)')).length; }"
            )
            rows = {t: page.evaluate(count_rows, t) for t in tables}
            width = page.evaluate("document.documentElement.scrollWidth")
            page.screenshot(path=screenshot, full_page=True)
        finally:
            browser.close()
    return {"images": images, "rows": rows, "errors": errors, "width": width}


@pytest.mark.slow
def test_report_renders_in_chromium(report_run, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"{CHROMIUM} is not installed (Debian package chromium): the report cannot be rendered"
        )
    from tfopt.report import build

    started = time.perf_counter()
    report = build(report_run)
    build_s = time.perf_counter() - started
    html_path = report["paths"]["html"]
    assert os.path.isfile(html_path) and os.path.isfile(report["paths"]["md"])
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    assert 'src="data:image/png;base64,' in page and "<link" not in page and 'src="http' not in page

    shot = str(tmp_path / "report.png")
    started = time.perf_counter()
    seen = check_in_browser(html_path, expected_tables(report), shot)
    browser_s = time.perf_counter() - started
    print(f"report build {build_s:.1f} s, browser check {browser_s:.1f} s, screenshot {shot}")
    if os.environ.get("TFOPT_REPORT_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["TFOPT_REPORT_SCREENSHOT"])

    assert seen["errors"] == []
    assert len(seen["images"]) == len(report["paths"]["images"]) >= 2, seen["images"]
    assert all(
        i["w"] > 0 and i["h"] > 0 and i["src"].startswith("data:image/png") for i in seen["images"]
    ), seen
    missing = {t: n for t, n in seen["rows"].items() if n < 1}
    assert not missing, f"tables missing or empty: {missing}"
    assert seen["rows"]["variants"] == len(report["variants"])
    assert seen["width"] <= 1280 + 1, "the page scrolls sideways: a table is too wide"
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
