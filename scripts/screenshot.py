"""Screenshot a rendered leaderboard page with headless Chromium (for the README).

    python scripts/screenshot.py PAGE PNG [WIDTH [HEIGHT]]      # 1400 x 900 by default

docs/leaderboard.png is the real H200 run's page (tests/fixtures/gpu_run, re-rendered with
`python -m grader leaderboard --out COPY`) at 1400 x 1150; the three screenshots of a 300-student
class come from the browser tests (SAVE_SCREENSHOTS=1 pytest tests/test_browser.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> int:
    page_path, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 1400
    height = int(sys.argv[4]) if len(sys.argv) > 4 else 900
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(page_path.as_uri())
        page.screenshot(path=str(out), full_page=False)
        browser.close()
    print(f"screenshot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
