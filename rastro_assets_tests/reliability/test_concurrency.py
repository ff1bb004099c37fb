"""Two processes syncing one account at once, and an analyst holding the file.

DuckDB lets one process at a time open the file read-write, and a read-only
session in another process keeps writers out too. Every sync opens the file
only for each write and retries the lock with back-off, so racing syncs end
in Meta's truth with nothing lost or doubled, and a sync meeting an analyst's
long session waits and then succeeds (or, with a short wait, fails with the
clear lock message) — and the file stays whole either way. On PostgreSQL the
racers write at once, ordered by the server's locks, and must end the same way;
an analyst's session holds nothing there, so those cases are the file's alone.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path

import httpx
import pytest

from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.sync.syncer import Syncer
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.reliability.helpers import (
    check_integrity,
    child_env,
    client_factory,
    make_syncer,
    perturb,
    spend_by_day,
    truth_by_day,
)
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.app import FakeGraphTransport
from rastro_fake_graph.world import FakeWorld

REPO = Path(__file__).resolve().parents[2]
CHILD = [sys.executable, "-m", "rastro_assets_tests.reliability._child"]
ACCOUNT = "act_101"
TODAY = date(2026, 11, 30)
HOLD_SECONDS = 20.0


def read_line(process: subprocess.Popen, timeout_seconds: float, log: Path) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout_seconds)
    if not ready:
        raise AssertionError(
            f"child {process.pid} said nothing within {timeout_seconds:.0f} s: {log.read_text()}"
        )
    line = process.stdout.readline().decode().strip()
    if not line:
        raise AssertionError(f"child {process.pid} ended: {log.read_text()}")
    return line


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*CHILD, *args], cwd=REPO, env=env or {**os.environ}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=log.open("wb"),
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for stream in (process.stdin, process.stdout):
        if stream:
            stream.close()


@pytest.mark.slow
@pytest.mark.engines("duckdb", "postgres")
def test_two_processes_syncing_one_account_end_in_meta_s_truth(
    tmp_path, warehouse, warehouse_env, linked_world, fake_graph, fake_clock, secrets_key
):
    since, until = TODAY - timedelta(days=59), TODAY
    assert make_syncer(warehouse, linked_world, fake_clock).sync(
        SyncRequest(ACCOUNT, since, until, run_id="good")
    ).ok
    perturb(linked_world, ACCOUNT, since, until)
    # Ranges of ~4 days: each racer writes ~15 chunks, each its own transaction.
    linked_world.row_cap = 40

    racers = []
    try:
        for name in ("racer-a", "racer-b"):
            log = tmp_path / f"{name}.log"
            racer = start(["sync", "--graph", fake_graph.base_url,
                           "--account", ACCOUNT, "--since", since.isoformat(),
                           "--until", until.isoformat(), "--run-id", name,
                           "--at", NOW.isoformat(), "--page-size", "10"],
                          log, child_env(warehouse_env))
            racers.append((racer, log))
        for racer, log in racers:
            assert read_line(racer, 60, log) == "ready"
        for racer, _ in racers:  # both go at once
            racer.stdin.write(b"go\n")
            racer.stdin.flush()
        results = [json.loads(read_line(racer, 120, log)) for racer, log in racers]
    finally:
        for racer, _ in racers:
            stop(racer)

    for result in results:
        assert (result["outcome"], result["error"]) == ("ok", None), result
        assert result["complete_days"] == 60
    (a_start, a_end), (b_start, b_end) = (result["wall"] for result in results)
    assert max(a_start, b_start) < min(a_end, b_end), "the two syncs did not overlap"
    check_integrity(warehouse)
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, ACCOUNT, since, until)
        assert_site_spend_exact(con)
        keys, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (ad_account_id, ad_id, day)) FROM ad_spend_daily"
        ).fetchone()
        runs = {run.run_id: run for run in runs_by_account(sync_run_rows(con))[ACCOUNT]}
    assert keys == distinct
    assert {runs[name].outcome for name in ("racer-a", "racer-b")} == {"ok"}


class HoldOnRequest(httpx.BaseTransport):
    """The fake Graph in-process; when a sync asks for `trigger_since`, an analyst
    first opens the warehouse read-only (in its own process) for HOLD_SECONDS."""

    def __init__(self, world, warehouse: Warehouse, trigger_since: date, log: Path) -> None:
        self.inner = FakeGraphTransport(world)
        self.warehouse = warehouse
        self.trigger = f'"since":"{trigger_since.isoformat()}"'
        self.log = log
        self.holder: subprocess.Popen | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.holder is None and self.trigger in httpx.URL(request.url).params.get(
            "time_range", ""
        ):
            self.holder = start(["hold", "--db", self.warehouse.path,
                                 "--seconds", str(HOLD_SECONDS)], self.log)
            said = read_line(self.holder, 60, self.log)
            assert said.startswith("locked"), said
        return self.inner.handle_request(request)


def analyst_case(warehouse, world, clock, tmp_path, lock_wait_seconds: float):
    since, until = TODAY - timedelta(days=6), TODAY
    assert make_syncer(warehouse, world, clock).sync(
        SyncRequest(ACCOUNT, since, until, run_id="good")
    ).ok
    perturb(world, ACCOUNT, since, until)
    with warehouse.connect() as con:
        before = spend_by_day(con, ACCOUNT, since, until)
    world.row_cap = 20  # a week in chunks of about two days: [0-1], [2-3], [4-5], [6]
    transport = HoldOnRequest(world, warehouse, since + timedelta(days=2), tmp_path / "holder.log")
    waiting = Warehouse(warehouse.path, lock_wait_seconds=lock_wait_seconds)
    syncer = Syncer(waiting, client_factory(world, transport=transport), clock=clock)
    return syncer, transport, since, until, before


@pytest.mark.slow
@pytest.mark.engines("duckdb")
def test_an_analyst_session_makes_a_sync_wait_then_it_succeeds(
    tmp_path, warehouse, linked_world, fake_clock, secrets_key
):
    syncer, transport, since, until, _ = analyst_case(
        warehouse, linked_world, fake_clock, tmp_path, lock_wait_seconds=60
    )
    started = time.monotonic()
    try:
        outcome = syncer.sync(SyncRequest(ACCOUNT, since, until, run_id="waited"))
        waited = time.monotonic() - started
    finally:
        if transport.holder is not None:
            stop(transport.holder)
    assert transport.holder is not None, "the analyst never came"
    assert transport.holder.returncode == 0, (transport.log.read_text())
    assert (outcome.outcome, outcome.error) == ("ok", None)
    assert waited >= HOLD_SECONDS - 5, f"the sync did not wait for the analyst ({waited:.1f} s)"
    check_integrity(warehouse)
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, ACCOUNT, since, until)
        assert_site_spend_exact(con)


@pytest.mark.slow
@pytest.mark.engines("duckdb")
def test_with_a_short_lock_wait_a_sync_fails_clearly_and_keeps_the_file_whole(
    tmp_path, warehouse, linked_world, fake_clock, secrets_key
):
    syncer, transport, since, until, before = analyst_case(
        warehouse, linked_world, fake_clock, tmp_path, lock_wait_seconds=2
    )
    try:
        with pytest.raises(WarehouseLocked) as raised:
            syncer.sync(SyncRequest(ACCOUNT, since, until, run_id="locked-out"))
        holder_pid = transport.holder.pid
    finally:
        if transport.holder is not None:
            stop(transport.holder)  # the analyst closes the session
    message = str(raised.value)
    assert "is locked by another process" in message and f"PID {holder_pid}" in message
    assert "query the analytics snapshot" in message
    assert TOKEN not in message

    check_integrity(warehouse)
    truth = truth_by_day(linked_world, ACCOUNT, since, until)
    with warehouse.connect() as con:
        after = spend_by_day(con, ACCOUNT, since, until)
        assert_site_spend_exact(con)
        [account] = planned_accounts(con, [ACCOUNT])
        runs = {run.run_id: run for run in runs_by_account(sync_run_rows(con))[ACCOUNT]}
    # The read's chunks wait to be written together, and the analyst held the file
    # when they were: every day is as it was, none half-written.
    assert truth != before
    assert after == before
    # The lock kept the run from recording its end: the planner sees a dead run.
    assert runs["locked-out"].finished_at is None
    later = runs["locked-out"].started_at + cadence.LEASE + timedelta(minutes=1)
    assert cadence.status(account.state, later).last_error == cadence.RUN_TIMEOUT_ERROR

    fake_clock.set(later)
    again = make_syncer(warehouse, linked_world, fake_clock).sync(
        SyncRequest(ACCOUNT, since, until, run_id="after")
    )
    assert again.ok, again.error
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, ACCOUNT, since, until)



@pytest.mark.engines("duckdb", "postgres")
def test_a_wave_finding_its_connection_s_token_dead_at_once_records_every_account(
    warehouse, vault, fake_clock, secrets_key
):
    """Accounts of one connection synced together (a wave: threads, one held file) all
    meet the dead token: each marks the connection invalid, those updates of one row
    conflict, and no sync may fail for it, nor leave its run unfinished."""
    world = FakeWorld(clock=fake_clock, seed=3)
    accounts = [f"act_{300 + n}" for n in range(8)]
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, NOW)
        for account in accounts:
            world.add_account(account, timezone="UTC", currency="USD", n_ads=2, token=TOKEN)
    syncer = make_syncer(warehouse, world, fake_clock)
    for round_ in range(4):
        with warehouse.connect() as con:
            registry.save_connection(con, "c1", vault.seal("c1", TOKEN), fake_clock())
            for account in accounts:
                link_store.link_account(con, "s1", account, "c1", "UTC", "USD", NOW)
        world.kill_token(TOKEN, subcode=463)
        requests = [SyncRequest(account, TODAY, TODAY, run_id=f"wave-{round_}")
                    for account in accounts]
        with warehouse.held(), ThreadPoolExecutor(max_workers=4) as pool:
            outcomes = list(pool.map(syncer.sync, requests))
        assert {outcome.outcome for outcome in outcomes} == {"token"}
        with warehouse.connect() as con:
            connection = registry.get_connection(con, "c1")
            unfinished = con.execute(
                "SELECT count(*) FROM meta_sync_runs WHERE finished_at IS NULL"
            ).fetchone()[0]
        assert connection.status == "invalid"
        assert unfinished == 0
        # Meta's own words, once: not "invalid: ...invalid: ...invalid: ...".
        assert connection.last_error.count("META_TOKEN_INVALID") <= 2, connection.last_error
        assert "Session has expired" in connection.last_error
        world.revive_token(TOKEN)
        fake_clock.advance(minutes=1)
