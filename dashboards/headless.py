"""Open an HTML file in headless Chromium: console errors, images, text, network use, screenshot.

Used by the report tests and by ci/screenshot_report.sh. It drives Chromium through the
DevTools protocol over a pipe (`--remote-debugging-pipe`: JSON messages separated by NUL on
file descriptors 3 and 4), so it needs nothing but the standard library and a Chromium
binary — no Playwright, no browser download, no websocket package.

    python -m harness.dashboards.headless REPORT.html [SCREENSHOT.png [MAX_HEIGHT_PX]]

prints a JSON summary and exits 1 when the page logged errors or an image did not load. The
screenshot is of the whole page (1400 px wide), cut at MAX_HEIGHT_PX (default 16000).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe")
WIDTH = 1400
MAX_HEIGHT = 16000  # px of the full-page screenshot, so a 140-cell report stays a sane PNG

# Evaluated in the page after load (by DevTools, not by the page: the report itself has no JS).
IMAGES_JS = """JSON.stringify(Array.from(document.images, i => ({
    src: i.getAttribute('src').slice(0, 40), complete: i.complete,
    width: i.naturalWidth, height: i.naturalHeight})))"""


_TRAMPOLINE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
               "os.execv(sys.argv[3], sys.argv[3:])")


def find_chromium() -> str | None:
    """Path of a Chromium-like browser: $CHROMIUM, else the first of the usual names on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((p for p in map(shutil.which, CHROMIUM_CANDIDATES) if p), None)


@dataclass
class PageCheck:
    url: str
    console_errors: list[str] = field(default_factory=list)   # console.error, exceptions, log errors
    requests: list[str] = field(default_factory=list)         # every URL the page fetched
    images: list[dict] = field(default_factory=list)          # src, complete, width, height
    title: str = ""
    text: str = ""                                            # the page as a reader sees it
    screenshot: bytes | None = None

    @property
    def broken_images(self) -> list[dict]:
        return [i for i in self.images if not i["complete"] or i["width"] == 0]

    @property
    def ok(self) -> bool:
        return not self.console_errors and not self.broken_images


class _Pipe:
    """A DevTools session over the two pipes; `call` waits for its answer, keeping events."""

    def __init__(self, to_browser: int, from_browser: int, proc: subprocess.Popen):
        self.out = os.fdopen(to_browser, "wb", buffering=0)
        self.inp = os.fdopen(from_browser, "rb", buffering=0)
        self.proc = proc
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = self.inp.read(65536)
            if not chunk:
                raise RuntimeError(f"Chromium exited (code {self.proc.poll()})")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.out.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            e = self._read(deadline)
            if e.get("method") == method:
                return e
            self.events.append(e)


def check_page(path, screenshot: bool = True, chromium: str | None = None,
               timeout: float = 60.0, max_height: int = MAX_HEIGHT) -> PageCheck:
    """Load `path` (an HTML file) in headless Chromium and report what a reader would see."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium)")
    url = Path(path).resolve().as_uri()
    check = PageCheck(url)
    with tempfile.TemporaryDirectory(prefix="harness-chromium-") as profile:
        # Our end of each pipe stays here; Chromium gets the other ends as fds 3 (commands in)
        # and 4 (answers out), which is where --remote-debugging-pipe looks for them. A tiny
        # Python trampoline moves them there (sh cannot name fds above 9).
        cmd_r, cmd_w = os.pipe()
        ans_r, ans_w = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-c", _TRAMPOLINE, str(cmd_r), str(ans_w), chromium, *FLAGS,
             f"--user-data-dir={profile}", f"--window-size={WIDTH},900", "about:blank"],
            pass_fds=(cmd_r, ans_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(ans_w)
        pipe = _Pipe(cmd_w, ans_r, proc)
        try:
            _drive(pipe, url, check, screenshot, timeout, max_height)
        finally:
            close_browser(pipe, proc)
    return check


def close_browser(pipe, proc) -> None:
    """Ask the browser to quit, wait for it (kill it if it will not) and close the pipe."""
    try:
        pipe.call("Browser.close", timeout=5)
    except Exception:  # noqa: BLE001 - it is going away either way
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    pipe.out.close()
    pipe.inp.close()


def _drive(pipe: _Pipe, url: str, check: PageCheck, screenshot: bool, timeout: float,
           max_height: int) -> None:
    target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
    session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        pipe.call(f"{domain}.enable", session=session)
    pipe.call("Emulation.setDeviceMetricsOverride",
              {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False},
              session=session)
    pipe.events.clear()  # about:blank's own events
    pipe.call("Page.navigate", {"url": url}, session=session, timeout=timeout)
    pipe.wait_event("Page.loadEventFired", timeout=timeout)
    images = pipe.call("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True},
                       session=session)
    check.images = json.loads(images["result"]["value"])
    title = pipe.call("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                      session=session)
    check.title = title["result"].get("value", "")
    text = pipe.call("Runtime.evaluate", {"expression": "document.body.innerText",
                                          "returnByValue": True}, session=session)
    check.text = text["result"].get("value", "")
    if screenshot:
        size = pipe.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        height = min(int(size["height"]) + 1, max_height)
        shot = pipe.call("Page.captureScreenshot",
                         {"format": "png", "captureBeyondViewport": True,
                          "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1}},
                         session=session, timeout=timeout)
        check.screenshot = base64.b64decode(shot["data"])
    for e in pipe.events:
        method, params = e.get("method"), e.get("params") or {}
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            check.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                 for a in params.get("args") or []))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            what = (details.get("exception") or {}).get("description", "")
            check.console_errors.append(f"{details.get('text', 'exception')} {what}".strip())
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            check.console_errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            check.requests.append((params.get("request") or {}).get("url", ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    max_height = int(argv[2]) if len(argv) > 2 else MAX_HEIGHT
    check = check_page(argv[0], screenshot=len(argv) > 1, max_height=max_height)
    if len(argv) > 1 and check.screenshot:
        Path(argv[1]).write_bytes(check.screenshot)
    print(json.dumps({"url": check.url, "title": check.title, "console_errors": check.console_errors,
                      "images": len(check.images), "broken_images": check.broken_images,
                      "requests": [u for u in check.requests if not u.startswith("data:")],
                      "screenshot": argv[1] if len(argv) > 1 else None}, indent=2))
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
