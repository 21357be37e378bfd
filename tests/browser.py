"""A real headless browser for the tests of pages: Debian's chromium driven by selenium through
chromium-driver (.ci/run installs all three). Outside CI a machine without them skips those tests
with the reason; in CI (CI=true) a missing browser is a failure, so a page is never untested.

``Browser.open(path)`` loads a file:// page and returns what the page logged and requested; the
performance log records every network request the page makes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def need_browser():
    missing = [name for name, found in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if not found]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        reason = f"needs a headless browser: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


class Browser:
    def __init__(self, width=1280, height=2400):
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        options = Options()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--window-size={width},{height}", "--hide-scrollbars"):
            options.add_argument(arg)
        options.binary_location = CHROMIUM
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        self.driver = webdriver.Chrome(service=Service(DRIVER), options=options)

    def open(self, path: Path):
        """Load the page; (console messages, URLs it requested) while it loaded."""
        self.driver.get_log("browser"), self.driver.get_log("performance")  # forget earlier pages
        self.driver.get(Path(path).resolve().as_uri())
        self.wait_for("return document.body && document.body.dataset.ready === '1'")
        return self.console(), self.requests()

    def console(self) -> list[str]:
        return [f"{e['level']}: {e['message']}" for e in self.driver.get_log("browser")]

    def requests(self) -> list[str]:
        urls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
        return urls

    def wait_for(self, script: str, timeout: float = 30):
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.driver, timeout).until(lambda d: d.execute_script(script))

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def quit(self):
        self.driver.quit()
