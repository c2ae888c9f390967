"""A real headless Chromium driven over the DevTools protocol, with no library in between.

Chromium's ``--remote-debugging-pipe`` reads JSON commands from fd 3 and writes replies and
events to fd 4, each message ending in a NUL byte. :class:`Chromium` opens a page, runs
JavaScript in it and returns the values; every read has a deadline, so a stuck browser
fails the test instead of hanging it, and the browser is always closed (then killed).

    with Chromium(tmp_path) as browser:
        page = browser.open("file:///tmp/report.html")
        assert browser.evaluate(page, "document.title") == "..."
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "find_chromium"]


def find_chromium() -> str | None:
    return next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)


class Chromium:
    def __init__(self, profile: Path, timeout_s: float = 30.0):
        executable = find_chromium()
        if executable is None:
            raise FileNotFoundError("chromium is not installed")
        self.timeout_s = timeout_s
        self._next_id = 0
        self._buffer = b""
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()

        def onto_fds_3_and_4() -> None:  # in the child, before exec: the pipe ends Chromium expects
            high_r = fcntl.fcntl(commands_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(replies_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=onto_fds_3_and_4,
        )
        os.close(commands_r)
        os.close(replies_w)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer within {self.timeout_s} s")
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium exited (code {self.process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result (events read meanwhile are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> str:
        """A new tab at ``url``, loaded; returns its session id."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.navigate(session, url)
        return session

    def navigate(self, session: str, url: str) -> None:
        """Load ``url`` and wait until that document (not the one before it) is complete."""
        self.call("Page.navigate", {"url": url}, session)
        self.wait_for(session, f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, session: str, condition: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.evaluate(session, f"Boolean({condition})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never reached: {condition}")
            time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):  # then wait, then kill
            self.call("Browser.close")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        for fd in (self._commands, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
