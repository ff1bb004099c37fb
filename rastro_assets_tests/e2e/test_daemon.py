"""End to end: a real dagster-daemon keeps a linked account of the fake Graph fresh.

Link → the sensors add the partition and start a 90-day partition backfill
(three 30-day runs) → sync-now → live waves land → the token dies at Meta →
the account pauses → a new token is connected → the account resumes. All the
while two analysts hold sessions open on the analytics snapshot, one
read-only and one read-write, and nothing waits on them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from rastro_assets.analytics.publish import Publisher
from rastro_assets.meta.fake.server import serve
from rastro_assets.meta.fake.world import FakeWorld
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import Vault
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.analytics.analyst import Analyst
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.truth import assert_equals_truth

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "act_777"
NEW_TOKEN = "EAAnewTOKENq81ZrW0pLx3Tm5Yc"
POLL_SECONDS = 1.0
LAG_SECONDS = 30
LEASE_SECONDS = 30  # a killed wave's accounts are taken again this long after it started
MONITOR_SECONDS = 5


def instance_yaml(home: Path) -> dict:
    """The repo's instance configuration, with its storage moved into `home`."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["storage"] = {"sqlite": {"base_dir": str(home / "storage")}}
    config["local_artifact_storage"]["config"]["base_dir"] = str(home)
    config["compute_logs"]["config"]["base_dir"] = str(home / "logs")
    config["run_monitoring"]["poll_interval_seconds"] = MONITOR_SECONDS
    return config


def wait_for(what: str, predicate, timeout_seconds: float):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out after {timeout_seconds:.0f} s waiting for {what}")


@pytest.fixture
def daemon_world(tmp_path, secrets_key):
    world = FakeWorld(seed=11)
    world.add_account(ACCOUNT, timezone="Pacific/Auckland", currency="NZD", n_ads=3, token=TOKEN)
    world.add_token(NEW_TOKEN)
    world.grant(NEW_TOKEN, ACCOUNT)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(home)))
    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    warehouse.migrate()
    vault = Vault.from_env()
    now = datetime.now(UTC)
    with warehouse.connect() as con:
        registry.add_site(con, "s1", "Site one", now)
        registry.save_connection(con, "c1", vault.seal("c1", TOKEN), now)
        registry.link_account(con, "s1", ACCOUNT, "c1", "Pacific/Auckland", "NZD", now)
    snapshot_path = tmp_path / "analytics.duckdb"
    Publisher(warehouse, snapshot_path).publish()
    with serve(world) as server:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "RASTRO_DUCKDB_PATH": str(warehouse.path),
            "RASTRO_META_GRAPH_URL": server.base_url,
            "RASTRO_SECRETS_KEY": secrets_key,
            "RASTRO_SENSOR_INTERVAL_SECONDS": "5",
            "RASTRO_SYNC_LEASE_SECONDS": str(LEASE_SECONDS),
            "RASTRO_ANALYTICS_PATH": str(snapshot_path),
            "RASTRO_ANALYTICS_LAG_SECONDS": str(LAG_SECONDS),
        }
        daemon = Daemon(env, tmp_path / "daemon.log")
        daemon.start()
        try:
            # Read-write, as DBeaver and `duckdb FILE` open by default: it locks the file it
            # opened, which later publishes replace rather than write.
            with Analyst(snapshot_path, read_only=False) as writer:
                yield world, warehouse, vault, home, daemon, writer
        finally:
            daemon.stop()


class Daemon:
    """`dagster-daemon run` from the repo root, in a process group of its own."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=REPO,
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL the daemon with its code servers and run workers: nothing ends cleanly."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


def account_status(warehouse: Warehouse) -> cadence.AccountStatus:
    with warehouse.connect() as con:
        [account] = planned_accounts(con)
    return cadence.status(account.state, datetime.now(UTC))


def runs(warehouse: Warehouse, kind: str) -> list[tuple]:
    with warehouse.connect() as con:
        return con.execute(
            "SELECT since, until, outcome FROM meta_sync_runs WHERE kind = ? ORDER BY started_at",
            [kind],
        ).fetchall()


def wave_outcome_after(warehouse: Warehouse, instant: datetime) -> str | None:
    """The outcome of the first finished wave sync (live, daily, weekly) after `instant`."""
    with warehouse.connect() as con:
        row = con.execute(
            """
            SELECT outcome FROM meta_sync_runs
            WHERE kind IN ('live', 'daily', 'weekly') AND started_at > ? AND outcome IS NOT NULL
            ORDER BY started_at LIMIT 1
            """,
            [instant],
        ).fetchone()
    return row[0] if row else None


def sync_now(warehouse: Warehouse) -> datetime:
    requested_at = datetime.now(UTC)
    with warehouse.connect() as con:
        registry.request_sync(con, ACCOUNT, requested_at)
    return requested_at


def newest_published(snapshot_path: Path) -> tuple[datetime, datetime | None]:
    """What a new analyst session sees: when its snapshot was published, and its newest sync."""
    with Analyst(snapshot_path) as analyst:
        [[published_at, last_sync_at]] = analyst.query(
            "SELECT (SELECT published_at FROM snapshot_info),"
            " (SELECT max(last_sync_at) FROM account_sync_status)"
        )
    return datetime.fromisoformat(published_at), (
        datetime.fromisoformat(last_sync_at) if last_sync_at else None
    )


def busy_skips(home: Path) -> list[str]:
    """Every sensor tick the daemon skipped because the warehouse was locked."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    skips = []
    for state in instance.all_instigator_state():
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id):
            if tick.skip_reason and "the warehouse is busy" in tick.skip_reason:
                skips.append(f"{state.instigator_name}: {tick.skip_reason}")
    return skips


def test_the_daemon_backfills_syncs_pauses_and_resumes_while_analysts_read(daemon_world):
    world, warehouse, vault, home, daemon, writer = daemon_world
    log = daemon.log
    snapshot_path = Path(warehouse.path).with_name("analytics.duckdb")
    spend_rows = "SELECT count(*) FROM ad_spend_daily"
    assert writer.query(spend_rows) == [[0]]
    reader = None
    try:
        wait_for(
            "the 90-day backfill",
            lambda: (
                account_status(warehouse).state == "live" and len(runs(warehouse, "backfill")) >= 3
            ),
            timeout_seconds=240,
        )
        backfill = runs(warehouse, "backfill")
        assert [outcome for *_, outcome in backfill] == ["ok"] * len(backfill)
        assert max((until - since).days + 1 for since, until, _ in backfill) == 30
        today = local_date(datetime.now(UTC), "Pacific/Auckland")
        with warehouse.connect() as con:
            assert_equals_truth(
                con, world, ACCOUNT, today - timedelta(days=89), today - timedelta(days=2)
            )
        # The backfill's last run read the catalog and counts as the daily and weekly re-sync.
        with warehouse.connect() as con:
            [account] = planned_accounts(con)
            catalog = con.execute(
                "SELECT ad_id FROM ad_catalog WHERE ad_account_id = ?", [ACCOUNT]
            ).fetchall()
        assert {ad_id for (ad_id,) in catalog} == set(world.accounts[ACCOUNT].ads)
        now = datetime.now(UTC)
        assert cadence.plan(account.state, now).kind == "live"
        # Nor does a 7- or 28-day read follow within the hour (unless a new local day's
        # 04:00 slot falls inside it: that daily is owed).
        local_today = local_date(now, "Pacific/Auckland")
        slot = cadence.daily_slot(local_today, "Pacific/Auckland")
        if slot <= now:
            slot = cadence.daily_slot(local_today + timedelta(days=1), "Pacific/Auckland")
        horizon = min(now + timedelta(minutes=59), slot - timedelta(minutes=1))
        assert cadence.plan(account.state, horizon).kind == "live"
        reader = Analyst(snapshot_path, read_only=True)
        backfilled_view = reader.query(spend_rows)

        for _ in range(3):
            requested_at = sync_now(warehouse)
            outcome = wait_for(
                "a wave sync",
                lambda since=requested_at: wave_outcome_after(warehouse, since),
                120,
            )
            assert outcome == "ok"
        assert runs(warehouse, "daily") == runs(warehouse, "weekly") == []
        with warehouse.connect() as con:
            [[last_ok]] = con.execute(
                "SELECT max(finished_at) FROM meta_sync_runs WHERE outcome = 'ok'"
            ).fetchall()
        wait_for(
            "the last wave in a new analyst session",
            lambda: (newest_published(snapshot_path)[1] or last_ok - timedelta(1)) >= last_ok,
            LAG_SECONDS + 30,
        )
        seen_at = datetime.now(UTC)
        assert (seen_at - last_ok).total_seconds() <= LAG_SECONDS + POLL_SECONDS + 5

        world.kill_token(TOKEN, subcode=463)
        requested_at = sync_now(warehouse)
        wait_for("the pause", lambda: account_status(warehouse).state == "paused", 120)
        assert account_status(warehouse).last_error.startswith("META_TOKEN_INVALID")

        reconnected_at = datetime.now(UTC)
        with warehouse.connect() as con:
            registry.save_connection(con, "c1", vault.seal("c1", NEW_TOKEN), reconnected_at)
        outcome = wait_for(
            "the resumed sync", lambda: wave_outcome_after(warehouse, reconnected_at), 120
        )
        assert outcome == "ok"
        assert account_status(warehouse).state == "live"
        assert busy_skips(home) == []

        # SIGKILL the daemon and the wave's run worker while the wave waits on Meta: once the
        # lease and a monitoring poll are past, the cadence goes on by itself.
        world.server_stall_seconds = 300
        world.fail("insights", "timeout", times=None, account=ACCOUNT)
        asked = world.calls["insights"]
        sync_now(warehouse)
        wait_for("a wave stalled on Meta", lambda: world.calls["insights"] > asked, 120)
        daemon.kill()
        killed_at = datetime.now(UTC)
        world.clear_failures()
        daemon.start()
        outcome = wait_for(
            "a wave after the kill", lambda: wave_outcome_after(warehouse, killed_at), 180
        )
        assert outcome == "ok"
        resumed_in = (datetime.now(UTC) - killed_at).total_seconds()
        print(f"waves resumed {resumed_in:.0f} s after the kill (lease {LEASE_SECONDS} s)")
        assert resumed_in <= LEASE_SECONDS + MONITOR_SECONDS + 60
        today = local_date(datetime.now(UTC), "Pacific/Auckland")
        with warehouse.connect() as con:
            assert_equals_truth(con, world, ACCOUNT, today - timedelta(days=1), today)
        # The analysts' sessions never moved: each still reads the copy it opened.
        assert writer.query(spend_rows) == [[0]]
        assert reader.query(spend_rows) == backfilled_view
    except AssertionError:
        print(log.read_text()[-6000:])
        raise
    finally:
        if reader is not None:
            reader.close()
    leaks = [
        path
        for path in [*home.rglob("*"), snapshot_path]
        if path.is_file() and TOKEN.encode() in path.read_bytes()
    ]
    assert leaks == []
