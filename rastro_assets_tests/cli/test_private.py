"""`rastro daemon` and `rastro webserver` keep every socket and file they make from other users.

Another local user must reach nothing of the product, whatever umask the shell that started
it had. The unit tests plant what a second user could leave (a symlink, a directory of
theirs, a directory open to all) where the code servers' sockets go, and check each is
refused before anything is started. The slow test starts both commands under umask 000 in
a directory everyone may enter, then, as `nobody`, tries every Unix socket their processes
listen on and every entry of DAGSTER_HOME.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rastro_assets.cli.context import UsageError
from rastro_assets.cli.private import (
    TEMP_DIR_NAME,
    close_tree,
    private_directory,
    seal_process,
)
from rastro_assets_tests.cli.conftest import Rastro, assert_usage_error
from rastro_assets_tests.e2e.daemon_harness import instance_yaml

REPO = Path(__file__).resolve().parents[2]
WORKSPACE = REPO / "workspace.yaml"
SCRIPT = Path(sys.executable).with_name("rastro")
NOBODY = 65534
STARTUP_SECONDS = 60
STOP_SECONDS = 20
UNIX_ACCEPTING = "00010000"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# The private directory ----------------------------------------------------------------


def test_a_missing_directory_is_made_0700_whatever_the_umask(tmp_path: Path):
    with umask(0):
        made = private_directory(tmp_path / "tmp")
    assert made.is_dir()
    assert mode(made) == 0o700


def test_a_symlink_in_its_place_is_refused(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(0o700)
    (tmp_path / "tmp").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="symbolic link"):
        private_directory(tmp_path / "tmp")


def test_a_directory_open_to_others_is_refused_not_repaired(tmp_path: Path):
    planted = tmp_path / "tmp"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(UsageError, match="0777"):
        private_directory(planted)
    assert mode(planted) == 0o777


def test_a_file_in_its_place_is_refused(tmp_path: Path):
    (tmp_path / "tmp").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        private_directory(tmp_path / "tmp")


@needs_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path):
    planted = tmp_path / "tmp"
    planted.mkdir(0o700)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UsageError, match=f"uid {NOBODY}"):
        private_directory(planted)


def test_close_tree_takes_group_and_other_bits_off_and_follows_no_symlink(tmp_path: Path):
    home = tmp_path / "home"
    outside = tmp_path / "outside"
    with umask(0):
        (home / "storage" / "run").mkdir(parents=True)
        (home / "storage" / "run" / "compute.log").write_text("spend")
        (home / "dagster.yaml").write_text("")
        outside.mkdir()
        (outside / "theirs").write_text("")
    (home / "link").symlink_to(outside)
    (home / "file_link").symlink_to(outside / "theirs")

    assert close_tree(home) == 5

    for path in (home, home / "storage", home / "storage" / "run"):
        assert mode(path) == 0o700
    assert mode(home / "storage" / "run" / "compute.log") == 0o600
    assert mode(home / "dagster.yaml") == 0o600
    assert mode(outside) == 0o777
    assert mode(outside / "theirs") == 0o666
    assert close_tree(home) == 0


def test_seal_refuses_a_home_too_long_for_a_socket(tmp_path: Path):
    home = tmp_path / ("h" * (100 - len(str(tmp_path))))
    home.mkdir()
    with pytest.raises(UsageError, match="too long"):
        seal_process(home)
    # Refused before anything is made or the umask changes.
    assert list(home.iterdir()) == []


# Bad input ------------------------------------------------------------------------------


def test_the_daemon_without_dagster_home_is_one_line(rastro: Rastro):
    assert_usage_error(rastro("daemon", "-w", str(WORKSPACE)), "DAGSTER_HOME")


def test_the_daemon_without_a_workspace_is_one_line(rastro: Rastro, tmp_path: Path):
    missing = tmp_path / "workspace.yaml"
    code = rastro("daemon", "-w", str(missing), environ={"DAGSTER_HOME": str(tmp_path)})
    assert_usage_error(code, str(missing))


def test_the_daemon_over_a_planted_temporary_directory_is_one_line(tmp_path: Path):
    home = tmp_path / "home"
    (home / TEMP_DIR_NAME).mkdir(parents=True)
    (home / TEMP_DIR_NAME).chmod(0o777)
    answer = subprocess.run(
        [str(SCRIPT), "daemon", "-w", str(WORKSPACE)],
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 2, answer.stderr
    [line] = answer.stderr.splitlines()
    assert str(home / TEMP_DIR_NAME) in line and "0777" in line


# The real commands, as another user ------------------------------------------------------

def entries_of(home: Path) -> list[tuple[Path, str, int]]:
    """Every entry of `home` with its kind and mode, as root sees them now; one that goes
    meanwhile (SQLite's journal files) is left out."""
    found = []
    for root, dirs, files in os.walk(home):
        for path in [Path(root), *(Path(root, name) for name in dirs + files)]:
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                what = "dir"
            else:
                what = "file" if stat.S_ISREG(info.st_mode) else "other"
            found.append((path, what, stat.S_IMODE(info.st_mode)))
    return found


def session_processes(leader: int) -> list[int]:
    """Every process in the session `leader` started (its code servers included)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == leader:
                found.append(int(entry.name))
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def listening_sockets(pids: list[int]) -> set[str]:
    held: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            held |= socket_inodes(pid)
    found = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and int(fields[6]) in held and fields[3] == UNIX_ACCEPTING:
            found.add(fields[7])
    return found


def reachable(sockets: set[str], entries: list[tuple[Path, str]]) -> list[str]:
    """What this process can connect to, list, read or look up; `entries` with their kinds
    as root saw them."""
    reached = []
    for path in sorted(sockets):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                continue
            reached.append(f"connected to {path}")
    for path, what in entries:
        try:
            if what == "dir":
                os.listdir(path)
            elif what == "file":
                path.open("rb").close()
            else:
                os.stat(path)
        except OSError:
            continue
        reached.append(f"reached {path}")
    return reached


def as_nobody(sockets: set[str], entries: list[tuple[Path, str]]) -> list[str]:
    """What `nobody` could connect to, list, read or look up: asked from a forked child
    that drops to that uid (no executable of this venv need be open to it)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            answer = json.dumps(reachable(sockets, entries)).encode()
            os.write(write_end, answer)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(answer)


def code_server_sockets(home: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return [p for p in (home / TEMP_DIR_NAME).iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
    return []


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        argv,
        cwd=log.parent,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # What an operator's shell under `umask 000` hands down.
        preexec_fn=lambda: os.umask(0),
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_SECONDS)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory every user may enter, unlike pytest's own 0700 one: only the modes of
    what the commands make can keep `nobody` out."""
    base = Path(tempfile.mkdtemp(prefix="rastro-priv-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


@needs_root
@pytest.mark.slow
def test_under_umask_000_nobody_reaches_a_socket_or_file_of_the_daemon_or_webserver(
    open_base: Path,
):
    home = open_base / "home"
    with umask(0):
        home.mkdir()
        # An instance an earlier, loose start left open: everything readable by all.
        (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(home)))
        (home / "storage").mkdir()
        (home / "storage" / "left.log").write_text("an account's spend")
    env = {key: value for key, value in os.environ.items() if not key.startswith("RASTRO_")}
    env.pop("TMPDIR", None)
    env.update(
        DAGSTER_HOME=str(home),
        RASTRO_DUCKDB_PATH=str(open_base / "rastro.duckdb"),
        RASTRO_META_FAKE="true",
    )
    ui_socket = open_base / "ui" / "dagster.sock"
    daemon_argv = [str(SCRIPT), "daemon", "-w", str(WORKSPACE)]
    webserver_argv = [str(SCRIPT), "webserver", "--socket", str(ui_socket), "-w", str(WORKSPACE)]
    deadline = time.monotonic() + STARTUP_SECONDS
    with started(daemon_argv, env, open_base / "daemon.log") as daemon:
        # The daemon's code server first: two processes creating one new SQLite storage
        # at once is a race of Dagster's own, and not this test's subject.
        wait_for_sockets(home, 1, daemon, deadline)
        with started(webserver_argv, env, open_base / "webserver.log") as webserver:
            wait_for_sockets(home, 2, webserver, deadline)
            while not ui_socket.exists():
                assert time.monotonic() < deadline
                time.sleep(0.5)
            sockets = listening_sockets(
                session_processes(daemon.pid) + session_processes(webserver.pid)
            )
            unreachable_to_nobody(home, ui_socket, sockets)


def wait_for_sockets(home: Path, count: int, process: subprocess.Popen, deadline: float) -> None:
    """Until `count` code servers listen in DAGSTER_HOME's private directory."""
    while len(code_server_sockets(home)) < count:
        log = home.parent / f"{process.args[1]}.log"
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no code server socket of {process.args[1]}"
        time.sleep(0.5)


def unreachable_to_nobody(home: Path, ui_socket: Path, sockets: set[str]) -> None:
    """Every socket in `sockets` and every entry of `home`: none reached by `nobody`."""
    # The UI's socket, bound through /proc/self/fd: probed below by its own name.
    assert [s for s in sockets if s.endswith("/dagster.sock")]
    # No code server's socket outside the private directory (Dagster's default is /tmp).
    code_servers = {s for s in sockets if not s.endswith("/dagster.sock")}
    assert len(code_servers) >= 2
    assert all(s.startswith(f"{home / TEMP_DIR_NAME}/") for s in code_servers), code_servers
    entries = entries_of(home)
    assert len(entries) > 5

    assert as_nobody(code_servers | {str(ui_socket)}, [(p, what) for p, what, _ in entries]) == []
    # Not only the closed home: nothing inside is open to group or others either.
    assert [p for p, _, bits in entries if bits & 0o077] == []
    # The probe's own check: root reaches the same sockets.
    for path in code_servers | {str(ui_socket)}:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(path)
