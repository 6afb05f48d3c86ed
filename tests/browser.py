"""Headless Chromium for the page tests (Debian's chromium and chromium-driver; .ci/run installs them)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def chromium(width: int = 1000, height: int = 1400):
    """A headless Chromium driven by Selenium, or a skip that says what to install."""
    webdriver = pytest.importorskip("selenium.webdriver")
    driver_path = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not (driver_path and browser):
        pytest.skip("headless Chromium is not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(service=Service(driver_path), options=options)


def loaded_resources(browser) -> list[str]:
    """Every resource the page has loaded or called, by URL (scripts, styles, images, fetches)."""
    return browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def keep_artefact(shot: Path, name: str) -> None:
    """A screenshot kept for a person to look at, where SURPRISEGATE_TEST_ARTEFACTS names a folder."""
    artefacts = os.environ.get("SURPRISEGATE_TEST_ARTEFACTS")
    if artefacts:
        Path(artefacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artefacts) / name)
