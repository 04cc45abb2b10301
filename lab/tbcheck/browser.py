"""Headless Chromium driven over the DevTools pipe: load a page, evaluate JavaScript, screenshot.

Chromium started with ``--remote-debugging-pipe`` reads DevTools Protocol commands from file
descriptor 3 and writes replies and events to 4, as JSON messages ended by a NUL byte; no port is
opened. Debian's ``chromium`` package (tools/install.sh); as root it needs ``--no-sandbox``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


class BrowserError(Exception):
    """No browser, or the browser did not do what was asked; the message says which."""


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class Browser:
    """One headless Chromium with one page; a context manager that always ends the browser."""

    def __init__(self, width: int = 1500, height: int = 1100, timeout: float = 60.0) -> None:
        exe = find_chromium()
        if not exe:
            raise BrowserError("no Chromium found; install Debian's chromium (apt-get install chromium)")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="tbcheck-chromium-")
        self._log = open(os.path.join(self.profile, "chromium.log"), "wb")  # noqa: SIM115 (closed in close())
        cmd_r, self._cmd_w = os.pipe()  # we write commands, Chromium reads fd 3
        self._out_r, out_w = os.pipe()  # Chromium writes fd 4, we read
        args = [
            exe,
            "--headless=new",
            "--remote-debugging-pipe",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}",
        ]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox

        def to_3_and_4() -> None:  # in the child, before exec: the pipe ends where Chromium looks
            r, w = os.dup(cmd_r), os.dup(out_w)  # above 4 (3 and 4 may be these very pipes)
            os.dup2(r, 3, inheritable=True)
            os.dup2(w, 4, inheritable=True)

        self.proc = subprocess.Popen(
            [*args, "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            preexec_fn=to_3_and_4,
            close_fds=False,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.session = ""
        try:
            self._attach(width, height)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- protocol

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise BrowserError(f"Chromium did not answer within {self.timeout:g} s")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self.proc.poll()}): {self.log_tail()}")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def _attach(self, width: int, height: int) -> None:
        targets = self.send("Target.getTargets", session=False)["targetInfos"]
        page = next((t for t in targets if t["type"] == "page"), None)
        target = (
            page["targetId"]
            if page
            else self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        )
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)[
            "sessionId"
        ]
        self.send("Page.enable")
        self.resize(width, height)

    def resize(self, width: int, height: int) -> None:
        """The page's viewport (a page that scrolls inside itself shows no more than this)."""
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # ----------------------------------------------------------------- page

    def open(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"JavaScript error: {r['exceptionDetails'].get('exception', {}).get('description', r)}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, interval: float = 0.5) -> Any:
        """Evaluate until the value is truthy; the last value (falsy when the time ran out)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(interval)

    def screenshot(self, path: str, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            )
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)

    def log_tail(self, chars: int = 300) -> str:
        """The end of Chromium's own output (why it exited)."""
        try:
            with open(self._log.name, "rb") as fh:
                return fh.read()[-chars:].decode(errors="replace").strip() or "no output"
        except OSError:
            return "no output"

    def close(self) -> None:
        """End the browser (it exits when its command pipe closes) and remove its profile; idempotent."""
        if self.proc.returncode is not None and self._log.closed:
            return
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
