"""The leaderboard page in a real browser: headless Chromium (Debian's) driven by Playwright.

It must sort, fetch nothing from the network, and show an injected name as text. CI installs
both (.ci/run) and sets REQUIRE_BROWSER=1, so there the test fails rather than skips.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from grader.policy import Policy
from grader.report import write_reports
from grader.results import read_results, write_result

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EVIL = "<img src=x onerror=alert(1)>"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _browser_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or CHROMIUM is None:
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail("REQUIRE_BROWSER=1 but Chromium or Playwright is missing")
        pytest.skip("needs Debian's chromium and the playwright package")
    return sync_playwright


@pytest.fixture
def page_file(tmp_path) -> Path:
    """The page rendered from the real GPU run's result files, plus one hostile folder name."""
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    victim = next(r for r in read_results(out) if r.role == "student")
    write_result(out, dataclasses.replace(victim, id="evil", label=EVIL))
    write_reports(out, policy=Policy(pseudonyms=False, hide_solution=False))
    return out / "leaderboard.html"


def test_page_sorts_fetches_nothing_and_escapes(page_file, tmp_path):
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        requests, dialogs = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(page_file.as_uri())
        page.wait_for_load_state("load")

        assert all(u.startswith(("file:", "data:")) for u in requests), requests
        assert dialogs == []
        assert page.query_selector("img") is None
        assert EVIL in page.inner_text("#board")

        def column(header: str) -> list[str]:
            index = page.eval_on_selector_all("#board thead th", "(ths, h) => ths.findIndex(t => t.textContent.trim().startsWith(h))", header)
            return page.eval_on_selector_all("#board tbody tr", "(rows, i) => rows.map(r => r.cells[i].dataset.sort)", index)

        page.click("#board thead th:has-text('median ms') button")
        times = [float(x) for x in column("median ms")]
        assert times == sorted(times) and times[0] < 1e99
        assert page.get_attribute("#board thead th:has-text('median ms')", "aria-sort") == "ascending"
        page.click("#board thead th:has-text('median ms') button")
        assert [float(x) for x in column("median ms")] == sorted(times, reverse=True)
        page.click("#board thead th:has-text('submission') button")
        names = column("submission")
        in_browser_order = page.evaluate("ns => ns.slice().sort((a, b) => a.localeCompare(b))", names)
        assert names == in_browser_order and len(set(names)) > 3

        shot = tmp_path / "leaderboard.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        browser.close()


def test_fixtures_are_a_real_gpu_run():
    run = json.loads((FIXTURES / "_run.json").read_text())
    assert run["device"]["cuda"] and "H" in run["device"]["name"]
    statuses = {r.id: r.status.value for r in read_results(FIXTURES)}
    assert {"pass", "mismatch", "build_error", "runtime_error"} <= set(statuses.values())
    assert {"torch_reference", "sdpa_flash", "solution"} <= set(statuses)
