"""The leaderboard page in a real browser: headless Chromium (Debian's) driven by Playwright.

It must sort, fetch nothing from the network, and show an injected name as text; and with 300
students both pages, the instructors' and the students', must read on a projector (1024 px: the
key columns without scrolling sideways) and on a phone (400 px: every row a card with its time
and score). CI installs both (.ci/run) and sets REQUIRE_BROWSER=1, so there the tests fail
rather than skip. With SAVE_SCREENSHOTS=1 the instructors' page's three screenshots are also
written to docs/ (the README shows them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from grader.course.policy import Policy
from grader.report.pages import write_reports
from grader.course.results import read_results, write_result

from .big_class import make_class

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
DOCS = Path(__file__).parent.parent / "docs"
KEY_COLUMNS = ["#", "submission", "status", "cases", "median ms", "speedup", "score"]
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
            return page.eval_on_selector_all("#board tbody tr.main", "(rows, i) => rows.map(r => r.cells[i].dataset.sort)", index)

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


@pytest.fixture(scope="module")
def big_class(tmp_path_factory) -> dict[str, Path]:
    """Both pages of a 300-student class."""
    out = make_class(tmp_path_factory.mktemp("class") / "results")
    paths = write_reports(out, policy=Policy(pseudonym_salt="browser-test"))
    return dict(instructors=paths["leaderboard"], students=paths["students"])


def _open(p, path: Path, width: int, height: int):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": width, "height": height})
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    return browser, page


def _no_sideways_scroll(page) -> None:
    sizes = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert sizes[0] <= sizes[1], f"the page scrolls sideways: {sizes[0]} px wide in {sizes[1]} px"


def _save(page, tmp_path: Path, name: str) -> None:
    shot = tmp_path / name
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("SAVE_SCREENSHOTS") == "1":
        shutil.copyfile(shot, DOCS / name)


@pytest.mark.parametrize("which", ["instructors", "students"])
@pytest.mark.parametrize("width", [1024, 1400])
def test_key_columns_fit_a_projector(big_class, tmp_path, width, which):
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        browser, page = _open(p, big_class[which], width, 768 if width == 1024 else 900)
        _no_sideways_scroll(page)
        headers = page.eval_on_selector_all(
            "#board thead th", "ths => ths.map(t => [t.textContent.trim(), t.getBoundingClientRect().left, t.getBoundingClientRect().right])")
        assert [h[0] for h in headers] == KEY_COLUMNS
        assert all(0 <= left and right <= width for _, left, right in headers), headers
        assert page.evaluate("() => document.querySelectorAll('#board tbody.student').length") == 300
        chart = page.eval_on_selector("#chart", "e => e.getBoundingClientRect().height")
        assert chart < 700, f"the chart is {chart} px tall"
        counts = page.inner_text("#counts")
        assert counts.startswith("300 submissions:") and "pass" in counts
        # the details of a row open in place, under it
        page.click("#board tbody.student >> nth=0 >> summary")
        assert page.is_visible("#board tbody.student >> nth=0 >> dl")
        page.click("#board tbody.student >> nth=0 >> summary")
        # the projector's screenshot shows the ranking; the wide one the top of the page
        page.evaluate("() => window.scrollTo(0, 0)" if width > 1024 else
                      "() => document.querySelector('#board').scrollIntoView()")
        if which == "instructors":
            _save(page, tmp_path, f"leaderboard-{width}.png")
        browser.close()


@pytest.mark.parametrize("which", ["instructors", "students"])
def test_every_row_is_a_card_with_time_and_score_on_a_phone(big_class, tmp_path, which):
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        browser, page = _open(p, big_class[which], 400, 850)
        _no_sideways_scroll(page)
        assert not page.is_visible("#board thead")
        wanted = ["td.time", "td.score"]
        cards = page.eval_on_selector_all("#board tbody.student", """(bodies, wanted) => bodies.map(b => {
            const card = b.getBoundingClientRect();
            return wanted.map(sel => {
                const cell = b.querySelector(sel), r = cell.getBoundingClientRect();
                return [sel, cell.innerText.trim(), r.width > 0 && r.height > 0 && r.left >= card.left && r.right <= card.right && r.right <= 400];
            });
        })""", wanted)
        assert len(cards) == 300
        for card in cards:
            for sel, text, shown in card:
                assert shown and text, (sel, text)
        times = [card[0][1] for card in cards]
        assert any(t.startswith("median") and t.endswith("ms") for t in times)
        scores = [card[1][1] for card in cards]
        assert all(re.fullmatch(r"score\s*\d+(\.\d+)? / 90", t) for t in scores), scores[:5]
        heights = page.eval_on_selector_all("#board tbody.student tr.main", "rows => rows.map(r => r.getBoundingClientRect().height)")
        assert max(heights) < 140, max(heights)
        font = page.eval_on_selector("#chart text", "t => t.getBoundingClientRect().height")
        assert font >= 7, f"the chart's text is {font} px tall on a phone"
        if which == "instructors":
            page.eval_on_selector("#board", "e => e.scrollIntoView()")
            _save(page, tmp_path, "leaderboard-400.png")
        browser.close()
