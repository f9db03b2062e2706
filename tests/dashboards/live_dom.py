"""A live page's DOM once it shows what a test waits for: `dom_when(url, condition_js)`.

`chromium --dump-dom --virtual-time-budget=N` returns whatever the page holds when the budget
runs out. That is enough for MLflow's runs table, not for its System metrics charts, which mount
only once their metric histories and plotly's chunk have arrived: 1 of 8 such loads of one run's
tab had them (2026-12-02, this repo's test store). So this opens the page in headless Chromium
over the DevTools protocol (harness.dashboards.headless's pipe: the standard library and a
Chromium binary, nothing else), polls `condition_js` in the page in real time until it is true
or `timeout` passes, and returns `document.documentElement.outerHTML` either way: the test's
own assertions then say what was missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from harness.dashboards import headless


def dom_when(url: str, condition_js: str, timeout: float = 60.0,
             width: int = 1920, height: int = 1080) -> str:
    chromium = headless.find_chromium()
    with tempfile.TemporaryDirectory(prefix="harness-chromium-") as profile:
        cmd_r, cmd_w = os.pipe()
        ans_r, ans_w = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-c", headless._TRAMPOLINE, str(cmd_r), str(ans_w), chromium,
             *headless.FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "about:blank"],
            pass_fds=(cmd_r, ans_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(ans_w)
        pipe = headless._Pipe(cmd_w, ans_r, proc)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget",
                                {"targetId": target, "flatten": True})["sessionId"]
            pipe.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1,
                       "mobile": False}, session=session)
            pipe.call("Page.navigate", {"url": url}, session=session)
            deadline = time.monotonic() + timeout
            while not _true(pipe, session, condition_js) and time.monotonic() < deadline:
                time.sleep(0.25)
            return _evaluate(pipe, session, "document.documentElement.outerHTML") or ""
        finally:
            headless.close_browser(pipe, proc)


def _evaluate(pipe, session: str, expression: str):
    reply = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                      session=session)
    return reply.get("result", {}).get("value")


def _true(pipe, session: str, condition_js: str) -> bool:
    # An exception in the page (the app not mounted yet) reads as "not yet".
    return _evaluate(pipe, session, f"(() => {{ try {{ return !!({condition_js}); }} "
                                    f"catch (e) {{ return false; }} }})()") is True
