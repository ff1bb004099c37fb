"""`rastro webserver`: the Dagster UI on a Unix socket that only its directory's group reaches.

Another local user must reach nothing of the product, sockets included. The UI listens on
no TCP port, and its socket's directory keeps them out: a directory others may enter, one
of another user's, a symlink in its place or a file where the socket goes is refused
before anything listens. The slow test starts the real command and asks the UI through
the socket, then reads /proc for any TCP listener of the webserver process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rastro_assets.cli.context import UsageError
from rastro_assets.cli.webserver import bind_socket
from rastro_assets_tests.cli.conftest import Rastro, assert_usage_error

REPO = Path(__file__).resolve().parents[2]
WORKSPACE = REPO / "workspace.yaml"
SCRIPT = Path(sys.executable).with_name("rastro")
STARTUP_SECONDS = 60
STOP_SECONDS = 20
LOCATION = "rastro_assets"
TCP_LISTEN = "0A"
UNIX_ACCEPTING = "00010000"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    return home


@pytest.fixture
def webserver(rastro: Rastro, home: Path) -> Rastro:
    """`rastro webserver` in-process with the instance and workspace it needs: only the
    socket's checks are left to refuse."""

    def run(*args: str) -> tuple[int, str, str]:
        return rastro("webserver", "-w", str(WORKSPACE), *args, environ={"DAGSTER_HOME": str(home)})

    return run


def socket_dir(tmp_path: Path, mode: int = 0o750) -> Path:
    directory = tmp_path / "ui"
    directory.mkdir()
    directory.chmod(mode)
    return directory


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def test_a_directory_others_can_enter_is_refused(webserver: Rastro, tmp_path: Path):
    directory = socket_dir(tmp_path, 0o755)
    assert_usage_error(
        webserver("--socket", str(directory / "dagster.sock")), str(directory), "0755"
    )
    assert list(directory.iterdir()) == []


def test_a_symlinked_parent_is_refused(webserver: Rastro, tmp_path: Path):
    real = socket_dir(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert_usage_error(webserver("--socket", str(link / "dagster.sock")), str(link), "symbolic")
    assert list(real.iterdir()) == []


def test_a_regular_file_at_the_path_is_refused(webserver: Rastro, tmp_path: Path):
    path = socket_dir(tmp_path) / "dagster.sock"
    path.write_bytes(b"an operator's file\n")
    assert_usage_error(webserver("--socket", str(path)), str(path), "not a socket")
    assert path.read_bytes() == b"an operator's file\n"


def test_a_relative_socket_path_is_named_absolute(webserver: Rastro, tmp_path: Path, monkeypatch):
    directory = socket_dir(tmp_path, 0o755)
    monkeypatch.chdir(tmp_path)
    assert_usage_error(webserver("--socket", "ui/dagster.sock"), f"{directory} is open")


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(webserver: Rastro, tmp_path: Path):
    directory = socket_dir(tmp_path)
    os.chown(directory, 65534, -1)
    assert_usage_error(webserver("--socket", str(directory / "dagster.sock")), "uid 65534")
    assert list(directory.iterdir()) == []


def test_a_stale_socket_is_replaced(tmp_path: Path):
    path = socket_dir(tmp_path) / "dagster.sock"
    # What a SIGKILLed server leaves: the file, with nobody listening behind it.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    assert not answers(path)
    listener = bind_socket(str(path))
    try:
        # (The filesystem may hand the freed inode number straight back: an answer tells.)
        assert answers(path)
        assert path.stat().st_ino == listener.inode
    finally:
        listener.close()
    assert not path.exists()


def test_a_socket_that_answers_is_left_alone(tmp_path: Path):
    path = socket_dir(tmp_path) / "dagster.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen()
        with pytest.raises(UsageError, match="already listens"):
            bind_socket(str(path))
        assert answers(path)


def test_a_missing_directory_is_made_0750_whatever_the_umask(tmp_path: Path):
    path = tmp_path / "ui" / "dagster.sock"
    old = os.umask(0o077)
    try:
        listener = bind_socket(str(path))
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
        # The proxy connects through the directory's group: the file itself is open.
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
    finally:
        listener.close()


def test_a_missing_grandparent_is_one_line(webserver: Rastro, tmp_path: Path):
    path = tmp_path / "nowhere" / "ui" / "dagster.sock"
    assert_usage_error(webserver("--socket", str(path)), str(path.parent), "does not exist")


# The real command --------------------------------------------------------------------


def tcp_listeners(pid: int) -> set[int]:
    """Inodes of the TCP sockets in LISTEN state that `pid` holds open."""
    held = socket_inodes(pid)
    listening = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if fields[3] == TCP_LISTEN:
                listening.add(int(fields[9]))
    return held & listening


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def unix_listeners(pid: int) -> list[str]:
    """The bound path of each listening Unix socket `pid` holds open."""
    held = socket_inodes(pid)
    found = []
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and int(fields[6]) in held and fields[3] == UNIX_ACCEPTING:
            found.append(fields[7])
    return found


def location_loaded(client: httpx.Client) -> bool:
    try:
        answer = client.post(
            "http://ui/graphql",
            json={
                "query": "{ workspaceOrError { ... on Workspace { locationEntries {"
                " name locationOrLoadError { __typename } } } } }"
            },
        )
    except httpx.TransportError:
        return False
    entries = answer.json()["data"]["workspaceOrError"].get("locationEntries") or []
    return any(
        entry["name"] == LOCATION
        and (entry["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation"
        for entry in entries
    )


@contextlib.contextmanager
def started(sock: Path, home: Path, tmp_path: Path) -> Iterator[subprocess.Popen]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RASTRO_")}
    env.update(DAGSTER_HOME=str(home), RASTRO_DUCKDB_PATH=str(tmp_path / "rastro.duckdb"))
    log = tmp_path / "webserver.log"
    process = subprocess.Popen(
        [str(SCRIPT), "webserver", "--socket", str(sock), "-w", str(WORKSPACE)],
        cwd=tmp_path,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_SECONDS)


@pytest.mark.slow
def test_the_ui_answers_on_the_socket_and_on_no_tcp_port(tmp_path: Path, home: Path):
    sock = tmp_path / "ui" / "dagster.sock"
    log = tmp_path / "webserver.log"
    with (
        started(sock, home, tmp_path) as process,
        httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=30) as client,
    ):
        deadline = time.monotonic() + STARTUP_SECONDS
        while not location_loaded(client):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)

        info = client.get("http://ui/server_info")
        assert info.status_code == 200
        assert info.json()["dagster_webserver_version"]
        version = client.post("http://ui/graphql", json={"query": "{ version }"}).json()
        assert version["data"]["version"]

        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o750
        assert tcp_listeners(process.pid) == set()
        # The same reading of /proc finds the socket the UI does listen on.
        assert [path for path in unix_listeners(process.pid) if path.endswith("/dagster.sock")]

        # systemd's stop: the server and its code server end, and the socket file goes.
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_SECONDS) == 0, log.read_text()[-3000:]
        assert not sock.exists()
