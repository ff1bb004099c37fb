"""A real `dagster-webserver` for the end-to-end tests, and its GraphQL as the UI sends it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rastro_assets_tests.e2e.daemon_harness import REPO

LOCATION = "rastro_assets"
STARTUP_SECONDS = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def webserver(env: dict[str, str], log: Path) -> Iterator[str]:
    """`dagster-webserver` on a free loopback port from the repo root; yields its GraphQL
    URL once it answers, and stops it with everything it started."""
    port = free_port()
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster-webserver"),
            "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml",
        ],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not location_loaded(url):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    assert not answer.get("errors"), answer["errors"]
    return answer["data"]


def location_loaded(url: str) -> bool:
    try:
        data = graphql(
            url,
            """{ workspaceOrError { ... on Workspace { locationEntries {
                 name locationOrLoadError { __typename } } } } }""",
        )
    except (urllib.error.URLError, ConnectionError):
        return False
    entries = data["workspaceOrError"].get("locationEntries") or []
    loaded = [e for e in entries if e["name"] == LOCATION]
    if loaded and loaded[0]["locationOrLoadError"]:
        assert loaded[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation", loaded
        return True
    return False
