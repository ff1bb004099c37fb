"""A running demo in a temp copy of the repo, for the end-to-end tests that drive one: the copy
(`Copy`, with `rastro` run in it), `rastro demo` in a session of its own (`running_demo`),
stopping it (`stop`), and brief read-only looks at its warehouse."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import duckdb

from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts

REPO = Path(__file__).resolve().parents[2]
# The venv running these tests already has the project installed (CI's own
# install step covers `pip install -e '.[test]'`): reuse its `rastro` rather
# than build a new venv for the copy.
RASTRO = Path(sys.executable).parent / "rastro"
# At least the demo's own stop budget: its runs swept, then `dagster dev` stopped, then its
# leftovers given time, each bounded in demo/dagster_process.py. On a loaded machine each
# bound runs out (loading Dagster to sweep the runs takes most of the first), and their sum
# is what the demo may take.
STOP_SECONDS = 75
POLL_SECONDS = 2.0
LOCK_WAIT_SECONDS = 60.0
T = TypeVar("T")


def copy_tracked_files(dest: Path) -> None:
    """The repo's tracked files as they are in the work tree (deleted ones skipped), with the
    bytecode the suite compiled for them (the root `conftest.py`): a cache a checkout has
    after its first run, which each of the copy's processes would otherwise compile again."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if not source.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        if source.suffix == ".py":
            copy_bytecode(source, target)


def copy_bytecode(source: Path, target: Path) -> None:
    cached = Path(importlib.util.cache_from_source(str(source)))
    if cached.is_file():
        target_cache = Path(importlib.util.cache_from_source(str(target)))
        target_cache.parent.mkdir(exist_ok=True)
        shutil.copy2(cached, target_cache)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what: str, predicate, timeout_seconds: float):
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_seconds:.0f} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def session_groups(sid: int) -> set[int]:
    """The process groups of session `sid` (the demo's, and Dagster's own)."""
    groups = set()
    for entry in session_processes(sid):
        with suppress(OSError):
            groups.add(os.getpgid(int(entry.split()[0])))
    return groups


def session_processes(sid: int) -> list[str]:
    """The live (not zombie) processes of session `sid`, as `pid command`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parens.
        state, _ppid, pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if state != "Z" and sid in (int(pgrp), int(session)):
            found.append(f"{entry.name} {cmdline[:160]}")
    return found


def read_only(db: Path, reader: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """`reader` over one brief read-only session; waits while a writer holds the file."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            con = duckdb.connect(str(db), read_only=True)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        try:
            con.execute("SET TimeZone = 'UTC'")  # as the product's own sessions
            return reader(con)
        finally:
            con.close()


def read(db: Path, sql: str) -> list[tuple]:
    return read_only(db, lambda con: con.execute(sql).fetchall())


class Copy:
    """A temp copy of the repo, and how to run `rastro` in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = root / "data" / "rastro.duckdb"
        self.key_file = root / "data" / "secrets.key"
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("RASTRO_", "DAGSTER_"))
        }
        # The copy's code, not the editable install's: what a clone would run.
        env["PYTHONPATH"] = str(root)
        # The demo publishes the analytics snapshot within a minute; half that here.
        env["RASTRO_ANALYTICS_LAG_SECONDS"] = "30"
        self.env = env

    def demo_env(self) -> dict[str, str]:
        return {**self.env, "RASTRO_SENSOR_INTERVAL_SECONDS": "5"}

    def rastro(self, *args: str, stdin: str | None = None) -> str:
        env = {**self.env, "RASTRO_DUCKDB_PATH": str(self.db)}
        for _ in range(5):
            result = subprocess.run(
                [str(RASTRO), *args],
                cwd=self.root,
                env=env,
                input=stdin,
                capture_output=True,
                text=True,
            )
            if result.returncode == 0:
                return result.stdout
            # `rastro` waits 60 s for the pipeline's writers; if it gave up, ask again.
            assert "locked" in result.stderr, f"rastro {' '.join(args)}: {result.stderr}"
        raise AssertionError(f"rastro {' '.join(args)}: {result.stderr}")

    def status(self) -> dict[str, dict]:
        """`rastro status --json`, by account."""
        return {
            entry["ad_account_id"]: entry for entry in json.loads(self.rastro("status", "--json"))
        }

    def quick_status(self) -> dict[str, dict]:
        """What `rastro status --json` says, asked in-process: polling spares the CPU."""
        now = datetime.now(UTC)
        return {
            account.state.ad_account_id: cadence.status(account.state, now).to_json(account.sites)
            for account in read_only(self.db, planned_accounts)
        }

    def runs(self) -> list[tuple]:
        return read(
            self.db,
            "SELECT ad_account_id, kind, started_at, outcome, error FROM meta_sync_runs"
            " ORDER BY started_at",
        )

    def registry(self) -> dict[str, list[tuple]]:
        """The rows `rastro demo` writes, less what syncs and `sync-now` move on."""
        queries = {
            "sites": "SELECT * FROM sites",
            "meta_connections": "SELECT connection_id, status, sealed_token, sealed_at,"
            " created_at FROM meta_connections",
            "meta_ad_accounts": "SELECT ad_account_id, connection_id, timezone, currency,"
            " name, created_at FROM meta_ad_accounts",
            "site_ad_accounts": "SELECT * FROM site_ad_accounts",
        }
        return {name: sorted(read(self.db, f"{sql} ORDER BY ALL")) for name, sql in queries.items()}


@contextmanager
def running_demo(
    copy: Copy, log: Path, umask: int | None = None
) -> Iterator[subprocess.Popen]:
    """`rastro demo --port P` in the copy's root, in a session of its own, under `umask` if
    given (else the test's).

    Killed (SIGKILL to the session) if the test leaves it running.
    """
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(RASTRO), "demo", "--port", str(free_port())],
            cwd=copy.root,
            env=copy.demo_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if umask is None else lambda: os.umask(umask),
        )
    with reaped(process, log):
        yield process


@contextmanager
def reaped(process: subprocess.Popen, log: Path) -> Iterator[None]:
    """The demo's log tail printed if the block fails, and whatever is left of the demo's
    session killed as it ends: no Dagster process outlives its test."""
    try:
        yield
    except BaseException:
        print(log.read_text(errors="replace")[-8000:])
        raise
    finally:
        if process.poll() is None or session_processes(process.pid):
            for group in session_groups(process.pid) | {process.pid}:
                with suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
            process.wait()


def stop(process: subprocess.Popen, sig: signal.Signals) -> float:
    """Send `sig` to the demo's process group; the seconds until its whole session is gone."""
    started = time.monotonic()
    os.killpg(process.pid, sig)
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"`rastro demo` ignored {sig.name} for {STOP_SECONDS} s:\n"
            + "\n".join(session_processes(process.pid))
        ) from None
    left = STOP_SECONDS - (time.monotonic() - started)
    try:
        wait_for(
            f"the demo's processes to exit on {sig.name}",
            lambda: not session_processes(process.pid),
            max(left, 1.0),
        )
    except AssertionError:
        raise AssertionError(
            f"left running after {sig.name}:\n" + "\n".join(session_processes(process.pid))
        ) from None
    # dagster dev exits 0 once its services are shut down; death by the signal is as clean.
    assert process.returncode in (0, -sig, 128 + sig), process.returncode
    return time.monotonic() - started

