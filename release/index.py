"""A real package index on loopback: a ``pypiserver`` process over a folder, for the length of a release.

Names the folder does not hold are redirected to PyPI by pypiserver's fallback, so an installer that
is given only this index takes ``trnmodels-*`` from here and every other name from PyPI: no name can
come from both.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from .build import sha256
from .errors import ReleaseError

HOST = "127.0.0.1"
PYPI_SIMPLE = "https://pypi.org/simple/"
LINK = re.compile(r'<a href="[^"]*">([^<]+)</a>')


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def parse_filename(filename: str) -> tuple[str, Version] | None:
    try:
        if filename.endswith(".whl"):
            name, version, *_ = parse_wheel_filename(filename)
        elif filename.endswith(".tar.gz"):
            name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return str(name), version


class LocalIndex:
    """``with LocalIndex(folder) as index:`` starts pypiserver on a free port (or ``port``), stops it on
    exit whatever happened; uploads need no password (the server listens on loopback only)."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder.resolve()
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.folder.parent / f"{self.folder.name}.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    @property
    def simple_url(self) -> str:
        return f"{self.url}simple/"

    def __enter__(self) -> LocalIndex:
        if self.port is not None and port_taken(self.port):
            raise ReleaseError(f"port {self.port} on {HOST} is already in use: pick another with --port")
        if self.folder.exists() and not self.folder.is_dir():
            raise ReleaseError(f"--index-dir: {self.folder} is a file; expected the index's package folder")
        self.port = self.port or free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pypiserver", "run", "-i", HOST, "-p", str(self.port)]
        cmd += ["-a", ".", "-P", ".", "--fallback-url", PYPI_SIMPLE, str(self.folder)]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise ReleaseError(f"pypiserver on port {self.port} exited at start: {' | '.join(tail)}")
            try:
                with urllib.request.urlopen(self.url + "health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise ReleaseError(f"pypiserver on port {self.port} did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def filenames(self, name: str) -> list[str]:
        """The files the server lists for ``name`` (its simple page; empty when it has none)."""
        try:
            with urllib.request.urlopen(f"{self.simple_url}{canonicalize_name(name)}/", timeout=10) as r:
                page = r.read().decode()
                if not r.url.startswith(self.url):  # redirected to the fallback: not held here
                    return []
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise ReleaseError(f"the local index answered {e.code} for {name}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ReleaseError(f"the local index at {self.url} does not answer: {e}") from None
        return LINK.findall(page)

    def versions(self, name: str) -> list[Version]:
        parsed = (parse_filename(f) for f in self.filenames(name))
        return sorted({p[1] for p in parsed if p and p[0] == canonicalize_name(name)})

    def held(self, filename: str) -> str | None:
        """sha256 of ``filename`` in the index's folder, or None."""
        path = self.folder / filename
        return sha256(path) if path.exists() else None

    def upload(self, files: list[Path]) -> list[str]:
        """Upload the files the index does not hold yet (a resumed release skips what an interrupted
        one already uploaded); a file held with other bytes is refused. Returns the names uploaded."""
        todo = []
        for path in files:
            held = self.held(path.name)
            if held is None:
                todo.append(path)
            elif held != sha256(path):
                raise ReleaseError(
                    f"the index already holds {path.name} with other content ({self.folder / path.name}): "
                    "a published file is never overwritten"
                )
        if todo:
            cmd = [sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar"]
            cmd += ["--repository-url", self.url, "-u", "release", "-p", "unused", *map(str, todo)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
                report = (lines or ["no output"])[-1][-300:]
                raise ReleaseError(
                    f"upload to {self.url} failed: {report} (run the release again: files already in the "
                    "index are not uploaded twice)"
                )
        return [p.name for p in todo]
