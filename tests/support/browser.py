"""A headless Chromium for the browser tests: the Debian package's binary and chromedriver, driven by Selenium (no
browser download). `chrome()` keeps the page's console log (`driver.get_log("browser")`)."""

from __future__ import annotations

import os
import shutil
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def available() -> bool:
    return bool(shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER))


def chrome(width: int = 1400, height: int = 1300) -> Any:
    """A headless Chromium (the caller quits it). Fails (CI) or skips (elsewhere) the test when it is missing."""
    if not available():
        import pytest

        message = "chromium and chromium-driver (Debian packages) are needed for the browser tests"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


__all__ = ["CHROMEDRIVER", "CHROMIUM", "available", "chrome"]
