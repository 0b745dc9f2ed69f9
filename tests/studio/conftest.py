"""The Studio under test: `jixu studio-fixture` then `jixu serve` (real processes, a random port of 127.0.0.1),
driven by Debian's Chromium through Python Playwright.

Chromium is the system browser (``/usr/bin/chromium``, from ``apt-get install -y chromium``); Playwright never
downloads one (``playwright install`` is never run). Without it these tests fail with a message saying how to
install it: jixu's suites never skip.

Screenshots of every page the tests visit are written to ``tests/studio/artifacts/`` (git-ignored); the path
of each is printed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

import jixu

CHROMIUM = Path(os.environ.get("JIXU_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SRC = Path(jixu.__file__).resolve().parent.parent
WAIT = 30.0
AGENT = "jixu.cli.studio:fixture_agent"
PROVIDERS = "jixu.cli.studio:fixture_providers"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Studio:
    """A running `jixu serve` over a store the fixture command filled; ``fixture`` is its --json output."""

    url: str
    fixture: dict[str, Any]
    process: subprocess.Popen[str]
    log: Path

    @property
    def studio(self) -> str:
        """The Studio's base URL."""
        return f"{self.url}/studio"

    def http(self) -> httpx.Client:
        """A plain HTTP client for hand-crafted posts (no redirects followed)."""
        return httpx.Client(base_url=self.url, timeout=WAIT, follow_redirects=False)


def start_studio(tmp: Path) -> Studio:
    """Run `jixu studio-fixture --json` into a fresh SQLite store, then `jixu serve` with its agent and providers."""
    store = tmp / "studio.db"
    made = subprocess.run([sys.executable, "-m", "jixu", "studio-fixture", "--store", str(store), "--json"],
                          capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert made.returncode == 0, f"studio-fixture failed ({made.returncode}): {made.stdout}\n{made.stderr}"
    fixture = json.loads(made.stdout)
    port = _free_port()
    log = tmp / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jixu", "serve", "--store", str(store), "--host", "127.0.0.1", "--port", str(port),
             "--agent", AGENT, "--providers", PROVIDERS, "--workspace-root", fixture["workspace_root"]],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"jixu serve did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return Studio(url, fixture, process, log)


def stop_studio(studio: Studio) -> None:
    """SIGTERM the server (it drains its worker) and wait for it."""
    studio.process.terminate()
    try:
        studio.process.wait(WAIT)
    except subprocess.TimeoutExpired:
        studio.process.kill()
        studio.process.wait(WAIT)


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Studio]:
    """One fixture store and server per test module."""
    started = start_studio(tmp_path_factory.mktemp("studio"))
    try:
        yield started
    finally:
        stop_studio(started)


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium, launched by Playwright (fails, never skips, without it).

    Package-scoped: Playwright's sync API runs an event loop in the main thread while it is open, and every
    later suite that calls ``asyncio.run`` would fail ("cannot be called from a running event loop").
    """
    if not CHROMIUM.exists():
        pytest.fail(f"the Studio's browser tests need Chromium at {CHROMIUM}: install it with "
                    "`apt-get update && apt-get install -y chromium` (never `playwright install`)", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the Studio's browser tests need Python Playwright: pip install -e '.[test]'", pytrace=False)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) and page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT * 1000)
    made = context.new_page()
    try:
        yield made
    finally:
        context.close()


class Shots:
    """Saves full-page screenshots as test artifacts, named after the test.

    A parametrized test saves each named shot once (its first case): the cases show the same page, and a
    full-page screenshot costs ~0.5 s.
    """

    taken: ClassVar[dict[tuple[str, str], Path]] = {}

    def __init__(self, test: str, function: str | None = None) -> None:
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)
        self.test = function or test
        ARTIFACTS.mkdir(exist_ok=True)

    def __call__(self, page: Any, name: str) -> Path:
        path = ARTIFACTS / f"{self.prefix}--{name}.png"
        if (self.test, name) in Shots.taken:
            return Shots.taken[self.test, name]
        page.screenshot(path=str(path), full_page=True)
        Shots.taken[self.test, name] = path
        print(f"screenshot: {path}")
        return path


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Shots:
    """``shots(page, "name")`` saves a screenshot under tests/studio/artifacts/."""
    return Shots(request.node.name, getattr(request.node, "originalname", None))


def log_in(page: Any, studio: Studio, token: str) -> None:
    """Log in through the login form."""
    page.goto(f"{studio.studio}/login")
    page.get_by_label("Bearer token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r".*/studio/threads$"))


def csrf_of(html: str) -> str:
    """The CSRF token in a page's forms."""
    found = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', html)
    assert found is not None, "the page has no CSRF token"
    return found.group(1)


def http_login(client: httpx.Client, token: str) -> None:
    """Log ``client`` in through the login form (the session cookie lands in its jar)."""
    response = client.post("/studio/login", data={"token": token, "next": "/studio/threads"})
    assert response.status_code == 303, response.text
