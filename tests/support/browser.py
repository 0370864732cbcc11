"""What the browser tests of the dashboard share: serving an ASGI app on a free port, a headless
Chromium driven through Selenium, waiting across the pages' own updates, and screenshots kept as
test artifacts.

Screenshots go to ``$KONDUIT_ARTIFACTS`` when set, else ``tests/artifacts/`` (git-ignored): one PNG
per page a test visits, named after the test and the page, so a reviewer can look at each page.
Registered as a plugin in ``tests/conftest.py`` (the ``browser`` fixture).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from konduit.web.app import server_config

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PNG = b"\x89PNG\r\n\x1a\n"


def artifacts_dir() -> Path:
    """Where screenshots are kept: ``$KONDUIT_ARTIFACTS``, else ``tests/artifacts``."""
    where = Path(os.environ.get("KONDUIT_ARTIFACTS") or Path(__file__).parent.parent / "artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save the current page as ``<artifacts>/<name>.png`` and check it is a real picture."""
    path = artifacts_dir() / (re.sub(r"[^A-Za-z0-9_.-]+", "-", name) + ".png")
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5_000, path
    return path


STRICT_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
              "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def strict_csp(web: FastAPI) -> FastAPI:
    """Serve ``web``'s pages under a Content-Security-Policy without inline script or style, as
    the security layer does, so a test proves the pages still work under it."""

    @web.middleware("http")
    async def csp(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", STRICT_CSP)
        return response

    return web


def csp_violations(driver: WebDriver) -> list[str]:
    """What the browser's console said about blocked content since the last call."""
    return [e["message"] for e in driver.get_log("browser")
            if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]


@contextmanager
def serving(web: FastAPI, *, trusted_proxies: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve ``web`` with uvicorn on a thread, on a free port, configured as ``konduit
    dashboard`` configures it (:func:`konduit.web.app.server_config`); yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(web, trusted_proxies=trusted_proxies))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    began = time.monotonic()
    while not server.started:
        assert thread.is_alive() and time.monotonic() - began < 10, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """A headless Chromium (skipped, saying what to install, when there is none)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.skip(f"no browser to drive: {', '.join(missing)} missing "
                    "(apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,1500", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for csp_violations
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def css(driver: WebDriver | WebElement, selector: str) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, selector)


def eventually(driver: WebDriver, check: Callable[[WebDriver], object], timeout: float = 20) -> None:
    """Wait for ``check`` across the page's own updates; on a timeout, say what the page and its
    console said."""
    def tolerant(d: WebDriver) -> object:
        # The page's script replaces nodes while it is read: chromedriver reports a node read
        # in between as stale or, sometimes, as a generic error that it "does not belong to
        # the document". Either means: look again.
        try:
            return check(d)
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return False
            raise

    try:
        WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=(
            StaleElementReferenceException, NoSuchElementException)).until(tolerant)
    except TimeoutException:
        console = [e["message"] for e in driver.get_log("browser")]
        main = driver.execute_script(
            "var m = document.querySelector('main'); return m ? m.outerHTML.slice(0, 200) : null;")
        raise AssertionError(f"timed out after {timeout} s on {driver.current_url}: console "
                             f"{console}, main {main}") from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives a real Chromium (the browser fixture); -m 'not browser' skips")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the ``browser`` fixture is marked ``browser``, so that
    ``pytest -m "not browser"`` leaves them all out without listing them."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
