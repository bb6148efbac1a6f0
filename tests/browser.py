"""A real headless Chromium for the tests, driven by Selenium.

Debian's /usr/bin/chromium and /usr/bin/chromedriver (scripts/install-test-deps
installs them) are used by path, so Selenium Manager never looks for, let
alone downloads, a browser or a driver; when either is missing the test fails
with the fix. The browser runs headless, as root and off the network: no
sandbox, no GPU, no QUIC, no background or component updates, no sync, no
proxy; a fresh profile in a temporary directory, removed when it quits; a
1280x900 window; the console logged at every level, so tests can read it.

- `chromium()` is a context manager: a browser of its own, quit on exit.
- The `browser` fixture is one browser shared by the whole run, started by
  the first test that asks for it and quit when pytest ends. Each test gets
  it on about:blank, with no cookies, an unread console and the standard
  window size; when the test fails, a screenshot of the page it left is
  saved. Import the fixture into the test module:
  ``from tests.browser import browser  # noqa: F401``.
- `console_errors(driver)` are the console's SEVERE messages since the last
  read; `screenshot(driver, name)` saves a PNG under the artifacts
  directory; `wait_for(driver, condition)` and `wait_for_text(driver, text)`
  wait with a deadline and fail the test with what the page showed.

Artifacts go to $EVERYSTEP_TEST_ARTIFACTS, else <repo>/test-artifacts;
screenshots to its screenshots/ directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import urllib3
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FIX = "run scripts/install-test-deps, which installs Debian's chromium and chromium-driver"
WINDOW_SIZE = (1280, 900)  # headless, the page's viewport is 1280x757 of it
PAGE_LOAD_TIMEOUT = 30.0
WAIT_TIMEOUT = 10.0
POLL_INTERVAL = 0.05
# What a browser that crashed or was quit answers: an error of the driver, or
# no connection to it at all.
BROWSER_GONE = (WebDriverException, urllib3.exceptions.HTTPError)
ARTIFACTS_VARIABLE = "EVERYSTEP_TEST_ARTIFACTS"
REPO = Path(__file__).resolve().parent.parent

# Headless, as root, on a machine without a network: the GPU, the sandbox
# (which refuses root), QUIC and every call home are off; /dev/shm may be small.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-proxy-server",
)


def require_chromium() -> None:
    """Fail the test, with the fix, unless Chromium and its driver are installed."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: {FIX}", pytrace=False)


def start_chromium(profile_dir: str | Path) -> webdriver.Chrome:
    """A started headless Chromium whose profile lives in `profile_dir`; the
    caller quits it (`driver.quit()`) and removes the directory."""
    require_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.add_argument("--window-size={},{}".format(*WINDOW_SIZE))
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Selenium talks to chromedriver on localhost: never through a proxy of the
    # environment. The option is the one that exists; it warns it will change.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        options.ignore_local_proxy_environment_variables()
    # Its own session: a Ctrl-C of the run reaches the tests, which then quit it.
    # Its configuration home in the profile: the crash reporter's database,
    # which ignores --user-data-dir, stays out of the user's ~/.config.
    service = Service(
        str(CHROMEDRIVER),
        env={**os.environ, "XDG_CONFIG_HOME": str(Path(profile_dir, "config"))},
        popen_kw={"start_new_session": True},
    )
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT)
    return driver


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile, quit and removed on exit."""
    profile = tempfile.mkdtemp(prefix="everystep-chromium-")
    try:
        driver = start_chromium(profile)
        try:
            yield driver
        finally:
            driver.quit()
            _kill_leftovers(driver)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def _kill_leftovers(driver: webdriver.Chrome) -> None:
    """Kill what is left of the process group chromedriver leads: a browser
    that outlived its driver (killed, or crashed) would hold on to its profile."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(driver.service.process.pid, signal.SIGKILL)


def reset(driver: webdriver.Chrome) -> None:
    """Put `driver` back to a blank start: about:blank, no cookies, an unread
    console, the standard window size."""
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.set_window_size(*WINDOW_SIZE)
    driver.get_log("browser")


def console_errors(driver: webdriver.Chrome, ignore: Iterable[str] = ()) -> list[str]:
    """The messages of the console's SEVERE entries since the last read,
    oldest first, minus those containing one of the `ignore` substrings.

    Reading consumes the console log: entries of every level read here are
    not returned again."""
    ignore = tuple(ignore)
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and not any(part in entry["message"] for part in ignore)
    ]


def artifacts_dir() -> Path:
    """Where the tests leave files for a human: $EVERYSTEP_TEST_ARTIFACTS,
    else <repo>/test-artifacts."""
    return Path(os.environ.get(ARTIFACTS_VARIABLE) or REPO / "test-artifacts")


def safe_name(name: str) -> str:
    """`name` as a file name: runs of anything but letters, digits, dot, dash
    and underscore become one underscore; never empty, at most 150 characters."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return cleaned[:150] or "unnamed"


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """Save what the browser shows to <artifacts>/screenshots/<name>.png
    (the name made safe, an older file replaced) and return its path."""
    path = artifacts_dir() / "screenshots" / f"{safe_name(name)}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not driver.save_screenshot(str(path)):
        raise OSError(f"the browser's screenshot could not be written to {path}")
    return path


def wait_for(
    driver: webdriver.Chrome,
    condition: Callable[[webdriver.Chrome], object],
    timeout: float = WAIT_TIMEOUT,
    message: str | None = None,
):
    """Poll `condition(driver)` until it returns a truthy value, which is
    returned; an element missing or replaced meanwhile counts as not yet.
    After `timeout` seconds fail the test, naming `message`, the page's URL
    and title, and a screenshot of it."""
    wait = WebDriverWait(
        driver,
        timeout,
        poll_frequency=POLL_INTERVAL,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )

    def checked(driver):
        try:
            return condition(driver)
        except WebDriverException as exc:
            # Chromium's word for an element of a page being replaced by the
            # next one (a navigation under way): stale, so not yet.
            if REPLACED_NODE in str(exc):
                return None
            raise

    try:
        return wait.until(checked)
    except TimeoutException:
        what = message or getattr(condition, "__name__", repr(condition))
        pytest.fail(f"timed out after {timeout}s waiting for {what}; {_page_state(driver, what)}")


REPLACED_NODE = "does not belong to the document"


def wait_for_text(driver: webdriver.Chrome, text: str, timeout: float = WAIT_TIMEOUT) -> WebElement:
    """Wait until the page's visible text contains `text`; return its body."""

    def shows_text(driver):
        body = driver.find_element(By.TAG_NAME, "body")
        return body if text in body.text else None

    return wait_for(driver, shows_text, timeout, message=f"the page to show {text!r}")


def _page_state(driver: webdriver.Chrome, name: str) -> str:
    """The page's URL and title and a fresh screenshot's path, for a failure."""
    try:
        path = screenshot(driver, f"timeout-{name}")
        return f"page {driver.current_url!r} titled {driver.title!r}, screenshot {path}"
    except (*BROWSER_GONE, OSError) as error:
        return f"the page could not be read: {error}".splitlines()[0]


class _SharedBrowser:
    """The one browser of the run, started on first use, restarted if it died,
    quit when pytest cleans up."""

    def __init__(self):
        self._stack: contextlib.ExitStack | None = None
        self._driver: webdriver.Chrome | None = None

    def get(self, config: pytest.Config) -> webdriver.Chrome:
        """The shared browser, reset to a blank start."""
        if self._driver is not None:
            try:
                reset(self._driver)
                return self._driver
            except BROWSER_GONE:
                self.close()
        self._stack = contextlib.ExitStack()
        self._driver = self._stack.enter_context(chromium())
        config.add_cleanup(self.close)
        reset(self._driver)
        return self._driver

    def close(self) -> None:
        """Quit the browser, if there is one, and remove its profile."""
        stack, self._stack, self._driver = self._stack, None, None
        if stack is not None:
            stack.close()


_shared = _SharedBrowser()


@pytest.fixture
def browser(request: pytest.FixtureRequest) -> Iterator[webdriver.Chrome]:
    """The run's shared headless Chromium, on a blank page with no cookies and
    an unread console; a screenshot named after the test is saved if it fails."""
    driver = _shared.get(request.config)
    failures_before = request.session.testsfailed
    yield driver
    # The test's own report is counted before its fixtures are torn down.
    if request.session.testsfailed > failures_before:
        with contextlib.suppress(*BROWSER_GONE, OSError):
            screenshot(driver, f"{request.node.nodeid}-failed")
    # A page left open would go on updating itself from the live server
    # (whose thread outlives the test), into the tests that follow.
    with contextlib.suppress(*BROWSER_GONE):
        driver.get("about:blank")
