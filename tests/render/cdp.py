"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe``, for browser tests.

Headless Chromium reads commands on fd 3 and writes replies and events on
fd 4, one JSON message per NUL-terminated chunk. No websocket library and no
network port are needed. Only what the report test uses is here: open a page,
evaluate JavaScript, collect console errors, exceptions and network requests,
take a screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    """The first Chromium-like browser on PATH."""
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, binary: str, user_data_dir: str, width: int = 1400, height: int = 2000) -> None:
        self.width, self.height = width, height
        # The pipe ends the browser keeps are moved above fd 10, and a shell puts them on fds 3
        # and 4 just before exec: dup2 in a preexec hook could clobber subprocess's own pipe.
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        child_in = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", "--disable-default-apps", "--mute-audio", "--remote-debugging-pipe",
                f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}", "about:blank"]
        script = f'exec "$0" "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-'
        shell = shutil.which("bash") or "sh"  # dash's redirections only take one-digit fds
        self.proc = subprocess.Popen([shell, "-c", script, binary, *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     pass_fds=(child_in, child_out))
        os.close(child_in)
        os.close(child_out)
        self._messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    # -- transport ---------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = os.read(self._from_browser, 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                self._messages.put(json.loads(raw))

    def send(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0,
             session: bool = True) -> dict[str, Any]:
        """Send a command (to the page's session unless ``session=False``) and wait for its reply."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._messages.get(timeout=max(0.01, deadline - time.monotonic()))
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float = 30.0, since: int = 0) -> dict[str, Any]:
        """The first event called ``method`` from ``events[since:]`` on (others are kept in ``events``)."""
        for event in self.events[since:]:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._messages.get(timeout=max(0.01, deadline - time.monotonic()))
            self.events.append(event)
            if event.get("method") == method:
                return event

    def drain(self, settle_s: float = 0.3) -> None:
        """Collect events that arrive within ``settle_s``."""
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            try:
                self.events.append(self._messages.get(timeout=0.05))
            except queue.Empty:
                pass

    # -- page ------------------------------------------------------------------
    def open(self, url: str) -> None:
        """A new page at ``url``, with console, log and network events enabled, loaded."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        since = len(self.events)
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired", since=since)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: str, full_page: bool = True) -> None:
        """A PNG of the page (all of it with ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = int(self.evaluate("document.documentElement.scrollHeight"))
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1})
        data = self.send("Page.captureScreenshot", params, timeout_s=60)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def console_errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries, as text."""
        errors = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(params["entry"].get("text", ""))
        return errors

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout_s=5)
        except Exception:  # the browser may be gone already
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        self._reader.join(timeout=5)  # the browser closed its end: the reader saw EOF
        os.close(self._from_browser)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
