"""The docs' pictures of the gate: `make demo`'s two intervene replies as `receipts view` draws them, in headless
Chromium (Debian's chromium and chromium-driver), saved to docs/images/.

    .venv/bin/python scripts/docs_screenshots.py            # runs the demo (about a minute), then the browser
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def surprisegate(*args: str, home: Path) -> None:
    env = os.environ | {"SURPRISEGATE_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "surprisegate", *args], check=True, env=env)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1000,800",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)


def screenshot(page: Path, out: Path) -> None:
    """The whole page: the window is made as tall as the page before the shot."""
    chrome = browser()
    try:
        chrome.get(page.as_uri())
        height = chrome.execute_script("return document.documentElement.scrollHeight")
        chrome.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1000, "height": min(int(height) + 40, 4000), "deviceScaleFactor": 1, "mobile": False},
        )
        chrome.save_screenshot(str(out))
    finally:
        chrome.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        receipts = home / "demo.jsonl"
        surprisegate("demo", "--receipts", str(receipts), home=home)
        rows = [json.loads(line) for line in receipts.read_text().splitlines() if line.strip()]
        gated = [r for r in rows if r.get("mode") == "intervene"]
        for name, row in zip(("receipt-question", "receipt-paragraph"), gated, strict=False):
            page = home / f"{name}.html"
            surprisegate("receipts", "view", str(receipts), "--id", row["reply_id"], "--html", str(page), home=home)
            screenshot(page, out / f"{name}.png")
            print(out / f"{name}.png")


if __name__ == "__main__":
    main()
