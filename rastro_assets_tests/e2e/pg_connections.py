"""Who holds the warehouse's PostgreSQL connections: `pg_stat_activity` sampled while an
end-to-end test runs, each connection traced through its loopback port to the local process
that opened it, and that process to its role (a run worker, the daemon, a code server, the
webserver, the test itself)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rastro_assets_tests.postgres_server import PostgresServer

PROC = Path("/proc")
SAMPLE_SECONDS = 0.5
# A process is known by the first of these its command line or an ancestor's holds: a run
# worker's step processes count as the run worker.
ROLES = (
    ("run worker", "execute_run"),
    ("by hand", "asset materialize"),
    ("code server", " grpc"),
    ("webserver", "dagster-webserver"),
    ("daemon", "dagster-daemon"),
)
# Named in the summary even when they held none.
EXPECTED_ROLES = (
    "run worker",
    "daemon",
    "daemon's code server",
    "webserver",
    "webserver's code server",
)


def _listening_inodes(ports: set[int]) -> dict[int, int]:
    """The socket inode of each local TCP endpoint on one of `ports`."""
    found = {}
    for table in ("net/tcp", "net/tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / table).read_text().splitlines()[1:]:
                fields = line.split()
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    found[int(fields[9])] = port
    return found


def _owners(inodes: dict[int, int]) -> dict[int, int]:
    """Each port's process, by the socket inodes its descriptors point at."""
    owners = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        port = inodes.get(int(link[8:-1]))
                        if port is not None:
                            owners[port] = int(entry.name)
    return owners


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _parent(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = (PROC / str(pid) / "stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    return 0


def _roles(pid: int, test_pid: int) -> Iterator[tuple[str, int]]:
    """The roles of `pid` and of its ancestors, nearest first."""
    here = pid
    while here > 1:
        if here == test_pid:
            yield "test", here
            return
        command = _cmdline(here)
        for role, mark in ROLES:
            if mark in command:
                yield role, here
                break
        here = _parent(here)


def role_of(pid: int, test_pid: int) -> tuple[str, int]:
    """The role of `pid` and the process that has it (itself or an ancestor); a code server
    is named by who started it (the daemon's, the webserver's)."""
    roles = _roles(pid, test_pid)
    role, holder = next(roles, ("other", pid))
    if role == "code server":
        parent = next(roles, ("", 0))[0]
        role = f"{parent}'s code server" if parent else role
    return role, holder


@dataclass
class ConnectionCounts:
    """The most warehouse connections one process of each role held at once, and in all."""

    per_process: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    processes: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    most_at_once: int = 0
    samples: int = 0

    def add(self, holders: list[tuple[str, int]]) -> None:
        self.samples += 1
        self.most_at_once = max(self.most_at_once, len(holders))
        for (role, pid), count in Counter(holders).items():
            self.per_process[role] = max(self.per_process[role], count)
            self.processes[role].add(pid)

    def summary(self) -> str:
        roles = sorted({*self.per_process, *EXPECTED_ROLES})
        held = ", ".join(
            f"{role}: at most {self.per_process.get(role, 0)} a process"
            f" ({len(self.processes.get(role, ()))} seen)"
            for role in roles
        )
        others = "".join(
            f"; {role} ({pid}): {_cmdline(pid)[:160]!r}"
            for role in sorted(set(self.processes) - {*EXPECTED_ROLES, "test"})
            for pid in sorted(self.processes[role])[:2]
        )
        return (
            f"{held}; at most {self.most_at_once} in all, over {self.samples} samples{others}"
        )


def sample(cursor, database: str, test_pid: int) -> list[tuple[str, int]]:
    """Each client connection to `database` now, as the role and process that holds it."""
    cursor.execute(
        "SELECT client_port FROM pg_stat_activity"
        " WHERE datname = %s AND backend_type = 'client backend' AND client_port > 0",
        [database],
    )
    ports = {port for (port,) in cursor.fetchall()}
    owners = _owners(_listening_inodes(ports))
    return [role_of(owners[port], test_pid) for port in ports if port in owners]


@contextlib.contextmanager
def counting_connections(server: PostgresServer, database: str) -> Iterator[ConnectionCounts]:
    """Samples `database`'s connections every `SAMPLE_SECONDS` until the block ends."""
    counts = ConnectionCounts()
    stop = threading.Event()

    def loop() -> None:
        with contextlib.closing(server.connect()) as con:
            con.autocommit = True
            with con.cursor() as cursor:
                while not stop.wait(SAMPLE_SECONDS):
                    counts.add(sample(cursor, database, os.getpid()))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join(timeout=10)
