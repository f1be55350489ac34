"""Headless Chromium driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``: JSON
messages ended by NUL on file descriptors 3 and 4), so no WebSocket library is needed; every wait bounded."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

TIMEOUT = 30.0


def executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Browser:
    """One headless browser with one page: :meth:`goto`, :meth:`evaluate`, :meth:`wait_until`, :meth:`screenshot`."""

    def __init__(self, profile: Path):
        exe = executable()
        if exe is None:
            raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
        to_child, self._to_browser = os.pipe()
        self._from_browser, from_child = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, its fd 4 writes the answers
            a, b = os.dup(to_child), os.dup(from_child)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
             "--window-size=1280,1000", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._next = 0
        self._buf = b""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events in between are skipped)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + TIMEOUT
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next:
                    if "error" in answer:
                        raise RuntimeError(f"{method}: {answer['error']}")
                    return answer.get("result", {})
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer {method} in {TIMEOUT} s")
            data = os.read(self._from_browser, 1 << 20)
            if not data:
                raise RuntimeError("chromium exited")
            self._buf += data

    def goto(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)
        self.wait_until("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return r.get("result", {}).get("value")

    def wait_until(self, expression: str, timeout: float = TIMEOUT) -> Any:
        end = time.monotonic() + timeout
        while True:
            v = self.evaluate(expression)
            if v:
                return v
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout} s waiting in the page for: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", session=True, format="png")["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._to_browser)
        os.close(self._from_browser)
