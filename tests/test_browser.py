"""The browser harness works against real pages: Chromium loads what a local
HTTP server on 127.0.0.1 serves, its console errors are read, screenshots are
PNG files, waits fail with the page named, a missing browser fails with the fix.

No database is touched; the harness is the same on every backend, so it runs
on one."""

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests import browser as harness
from tests.browser import (
    browser,  # noqa: F401
    console_errors,
    reset,
    screenshot,
    wait_for,
    wait_for_text,
)

pytestmark = pytest.mark.backends("sqlite")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def page(body: str, title: str = "everystep test page") -> str:
    """An HTML document; its empty icon keeps the browser from asking for
    /favicon.ico, whose 404 would be a console error of its own."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title><link rel='icon' href='data:,'></head>"
        f"<body>{body}</body></html>"
    )


class PageServer:
    """An HTTP server on 127.0.0.1 at a free port, in a thread, serving the
    pages added to it; any other path is a 404."""

    def __init__(self):
        pages = self.pages = {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                content = pages.get(self.path)
                if content is None:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                data = content.encode()
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def add(self, path: str, html: str) -> str:
        """Serve `html` at `path`; return its URL."""
        self.pages[path] = html
        host, port = self._server.server_address
        return f"http://{host}:{port}{path}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def site():
    with PageServer() as server:
        yield server


@pytest.fixture
def artifacts(tmp_path, monkeypatch):
    """The artifacts directory, redirected to the test's temporary directory."""
    monkeypatch.setenv(harness.ARTIFACTS_VARIABLE, str(tmp_path))
    return tmp_path


def test_a_page_served_on_127_0_0_1_loads_and_its_text_is_found(browser, site):  # noqa: F811
    url = site.add("/hello", page("<h1>Hello from everystep</h1>", title="Greeting"))

    browser.get(url)

    wait_for_text(browser, "Hello from everystep")
    assert browser.title == "Greeting"
    assert console_errors(browser) == []


def test_a_script_calling_console_error_is_reported_by_console_errors(browser, site):  # noqa: F811
    url = site.add(
        "/noisy",
        page(
            "<p>noisy</p><script>"
            "console.log('only information');"
            "console.error('boom from the page');"
            "console.error('expected noise');"
            "</script>"
        ),
    )
    browser.get(url)

    errors = wait_for(browser, lambda driver: console_errors(driver, ignore=["expected noise"]))

    assert len(errors) == 1, errors
    assert "boom from the page" in errors[0]
    assert console_errors(browser) == [], "a read consumes the console log"


def test_a_missing_page_is_a_console_error(browser, site):  # noqa: F811
    browser.get(site.add("/broken-image", page("<img src='/missing.png'>")))

    errors = wait_for(browser, console_errors, message="the console to report the 404")

    assert any("404" in message for message in errors), errors


def test_a_screenshot_is_a_png_file_under_the_artifacts_directory(browser, site, artifacts):  # noqa: F811
    browser.get(site.add("/shot", page("<h1 style='color: teal'>Picture this</h1>")))

    path = screenshot(browser, "tests/test_browser.py::a shot")

    assert path == artifacts / "screenshots" / "tests_test_browser.py_a_shot.png"
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_without_the_variable_artifacts_go_to_test_artifacts_in_the_repository(monkeypatch):
    monkeypatch.delenv(harness.ARTIFACTS_VARIABLE, raising=False)

    assert harness.artifacts_dir() == harness.REPO / "test-artifacts"


def test_a_wait_past_its_deadline_fails_naming_the_page_and_its_screenshot(
    browser,  # noqa: F811
    site,
    artifacts,
):
    url = site.add("/static", page("<p>nothing ever changes</p>", title="Still"))
    browser.get(url)

    with pytest.raises(pytest.fail.Exception) as failure:
        wait_for(browser, lambda driver: False, timeout=0.2, message="a change")

    message = str(failure.value)
    assert "timed out after 0.2s waiting for a change" in message
    assert url in message and "'Still'" in message
    assert (artifacts / "screenshots" / "timeout-a_change.png").exists()


def test_a_reset_browser_is_blank_with_no_cookies_left(browser, site):  # noqa: F811
    url = site.add("/cookie", page("<script>document.cookie = 'flavour=oat; path=/'</script>"))
    browser.get(url)
    assert browser.get_cookie("flavour") is not None

    reset(browser)

    assert browser.current_url == "about:blank"
    browser.get(url.replace("/cookie", "/missing"))
    assert browser.get_cookie("flavour") is None


def test_without_chromedriver_the_test_fails_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(harness, "CHROMEDRIVER", tmp_path / "chromedriver")

    with pytest.raises(pytest.fail.Exception, match="scripts/install-test-deps"):
        harness.require_chromium()
