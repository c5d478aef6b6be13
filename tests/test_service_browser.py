"""The service's pages in a real browser (issue 33): headless Chromium (Debian's) driven by
Playwright against the real server on loopback, at a phone's 400 px and a desk's 1400 px.

The upload page sends a real zip of a submission folder with the token in a header, says the
accepted id and lists the student's own submissions; a refusal shows the service's reason; a
hostile file name stays text. The live board renders its rows and, like the upload page, never
scrolls sideways. Screenshots go to the test's tmp folder. Skips as tests/test_browser.py does
(fails instead under REQUIRE_BROWSER=1)."""

from __future__ import annotations

import dataclasses
import io
import zipfile
from pathlib import Path

import pytest

from .test_browser import CHROMIUM, CHROMIUM_ARGS, EVIL, _browser_or_skip
from .test_service_pages import PagesService, checked, mismatching, passing

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "triton_flash"


def zipped_folder(folder: Path) -> bytes:
    """The folder as a student zips it: its files under one top folder."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, f"{folder.name}/{path.relative_to(folder)}")
    return out.getvalue()


def no_sideways_scroll(page) -> None:
    width, inner = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= inner, f"the page scrolls sideways: {width} px wide in a {inner} px window"


@pytest.fixture
def service(tmp_path):
    s = PagesService(tmp_path)
    s.graded("alice", "check", dataclasses.replace(checked(100.0, "alice"),
                                                  message=f"all 3 cases run pass; said {EVIL}"))
    s.graded("bob", "submission", passing(640.0, "bob"))
    s.graded("carol", "submission", mismatching("carol"))
    yield s
    s.stop()


@pytest.mark.parametrize("width", [400, 1400])
def test_the_upload_form_and_the_live_board(service, tmp_path, width):
    sync_playwright = _browser_or_skip()
    upload = zipped_folder(EXAMPLE)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.set_default_timeout(60_000)
            dialogs, urls = [], []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: urls.append(r.url))
            page.goto(service.url + "/")

            # a wrong token: the service's reason, word for word
            page.fill("#token", "not-a-token")
            page.check("input[name=kind][value=check]")
            page.set_input_files("#file", files=[dict(name=f"{EVIL}.zip",
                                                      mimeType="application/zip", buffer=upload)])
            page.click("#send")
            page.wait_for_function("document.getElementById('message').className === 'bad'")
            assert "Refused (401): unknown token" in page.inner_text("#message")

            # the student's token: accepted, its id said, the list shows it queued
            page.fill("#token", service.tokens["alice"])
            page.check("input[name=kind][value=submission]")
            page.click("#send")
            page.wait_for_function("document.getElementById('message').dataset.id")
            job_id = page.eval_on_selector("#message", "m => m.dataset.id")
            assert page.inner_text("#message").startswith(f"Accepted: submission {job_id}")
            page.wait_for_selector(f"#mine .sub[data-id='{job_id}']")
            card = page.inner_text(f"#mine .sub[data-id='{job_id}']")
            assert "queued" in card and "number 1 in the queue" in card
            cards = page.query_selector_all("#mine .sub")
            assert len(cards) == 2 and cards[0].get_attribute("data-id") == job_id  # newest first
            graded = cards[1].inner_text()
            assert "pass" in graded and "public cases 3/3" in graded and EVIL in graded
            job = service.store.jobs_of("alice")[-1]
            assert job.id == job_id and job.kind == "submission"
            assert job.upload.read_bytes() == upload
            assert dialogs == [] and page.query_selector("img") is None
            assert not any(service.tokens["alice"] in u for u in urls)   # never in an address
            no_sideways_scroll(page)
            page.screenshot(path=str(tmp_path / f"upload-{width}.png"), full_page=True)

            # reloaded, the tab remembers the token and lists the submission again
            page.reload()
            page.wait_for_selector(f"#mine .sub[data-id='{job_id}']")

            page.goto(service.url + "/leaderboard")
            rows = page.query_selector_all("#board tbody.student")
            assert len(rows) == 2
            assert service.policy.pseudonym("bob") in page.inner_text("#board")
            assert "2 of 3 students have a graded submission" in page.inner_text("#live")
            no_sideways_scroll(page)
            page.screenshot(path=str(tmp_path / f"leaderboard-{width}.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / f"upload-{width}.png").stat().st_size > 0
