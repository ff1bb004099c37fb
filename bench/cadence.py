"""Cost of freshness: what the cadence costs per account-day at 100, 1,000 and 5,000 accounts.

Two parts, in one run:
1. Simulate a day of sensor ticks on the planner's injected clock with N linked
   accounts spread over eight timezones (already backfilled). Each tick, the
   accounts due go into one wave, exactly as `meta_cadence` does. Counted:
   Dagster runs per day, syncs by kind, Meta calls per account-day (against
   Rastro's reference cadence, which reads the same ranges one account at a
   time), and the oldest any account's today gets.
2. Measure on a real Dagster instance what those runs cost: a wave of K
   accounts executed as its own process (`dagster job execute`, as the run
   launcher would), for two K, live and daily, reading the fake Graph over
   loopback. CPU seconds of the run process are split into a fixed cost per
   run and a cost per account sync; instance storage growth likewise. The
   clock is pinned (the fake's and the run's), each measured wave is the one
   45 minutes after a first: live waves once where no account is in the
   first 45 minutes of a three-hour local block and once where half are,
   since only those record their changed days as materializations.

Then: CPU seconds per account-day = (waves x fixed + syncs x per-sync + live syncs
in a recording block x their extra) / N,
and storage at steady state with retention = the latest materialization of
each account-day partition (two assets) plus its sync rows.

Part 1 also simulates a mixed population, a share of it idle (no spend today or
yesterday and no ACTIVE ad, so read live every 3 hours), and prints Meta calls per
account-day for the active and the idle accounts beside their goals (active: the
reference; idle: at most half of it). `--simulate-only` runs part 1 alone (seconds).

`--backend postgres` runs part 2 on `docs/dagster.scaled.yaml`'s storage (Postgres) on a real
PostgreSQL server started here (rastro_assets_tests/postgres_server.py, TLS as the config asks,
no fsync: a floor for a real server), and counts the server's CPU (its backends, reaped by the
postmaster) beside the run process's: both are the cadence's cost. `--event-batch-size N` sets
DAGSTER_EVENT_BATCH_SIZE in the runs' environment: Dagster then hands events that carry batch
metadata to `store_event_batch`, which dagster-postgres writes in one insert.

`--warehouse postgres` measures part 2 twice, on the same world at the same instants: with
the warehouse in the DuckDB file, then in a PostgreSQL database on a server started here
(`RASTRO_WAREHOUSE_URL`; same test server as above), whose CPU (its backends, reaped by the
postmaster) counts as the cadence's too; the figures print side by side.

Run: .venv/bin/python bench/cadence.py [--quick] [--idle-share 0.5] [--simulate-only]
     [--backend postgres] [--event-batch-size N] [--warehouse postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rastro_assets.defs.cadence.wave import (  # noqa: E402
    LIVE_RECORD_BLOCK_MINUTES,
    sealed_wave_config,
)
from rastro_assets.planner import cadence  # noqa: E402
from rastro_assets.planner.state import AccountState, Delivery, SyncRun  # noqa: E402
from rastro_assets.planner.wave_seal import SEAL_LABEL  # noqa: E402
from rastro_assets.timekeeping import local_date  # noqa: E402
from rastro_assets.vault import derived_key  # noqa: E402

TIMEZONES = [
    "America/Los_Angeles",
    "America/New_York",
    "America/Sao_Paulo",
    "Europe/London",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Asia/Tokyo",
    "Pacific/Auckland",
]
TICK = timedelta(seconds=60)
ADS_PER_ACCOUNT = 20
PAGE_SIZE = 500
START = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
WAVE_SECONDS_PER_ACCOUNT = 0.05  # wall time a wave holds the cadence (4 syncs at once)


# An active account has ACTIVE ads; an idle one has no spend and none (`cadence.is_idle`).
ACTIVE = Delivery(active_ad=True)
IDLE = Delivery()


def backfilled_state(index: int, now: datetime, delivery: Delivery = ACTIVE) -> AccountState:
    timezone = TIMEZONES[index % len(TIMEZONES)]
    linked = now - timedelta(days=2)
    today = local_date(linked, timezone)
    backfill = SyncRun(
        run_id=f"b{index}",
        kind="backfill",
        since=today - timedelta(days=89),
        until=today,
        started_at=linked,
        finished_at=linked + timedelta(minutes=2),
        outcome="ok",
        catalog=True,
    )
    return AccountState(
        ad_account_id=f"act_{index + 1}",
        timezone=timezone,
        linked_at=linked,
        connection_status="active",
        connection_error=None,
        token_sealed_at=linked - timedelta(minutes=1),
        sync_requested_at=None,
        runs=[backfill],
        delivery=delivery,
    )


def in_recording_block(instant: datetime, timezone: str) -> bool:
    """Whether a live wave at `instant` records its changed days (see `defs/cadence/wave.py`)."""
    local = instant.astimezone(ZoneInfo(timezone))
    minutes = local.hour * 60 + local.minute
    return minutes % LIVE_RECORD_BLOCK_MINUTES < cadence.LIVE_INTERVAL.total_seconds() // 60


def recording_instant(after: datetime, most: bool = True) -> datetime:
    """A minute within three hours of `after` at which the most (or fewest) bench
    timezones record, 10 minutes into that window."""
    instant = after.replace(second=0, microsecond=0)

    def recording(candidate: datetime) -> int:
        count = sum(in_recording_block(candidate, tz) for tz in TIMEZONES)
        return count if most else -count

    best = max(
        (instant + timedelta(minutes=step) for step in range(LIVE_RECORD_BLOCK_MINUTES)),
        key=lambda candidate: (recording(candidate), recording(candidate + timedelta(minutes=10))),
    )
    return best + timedelta(minutes=10)


def meta_calls(plan: cadence.Plan) -> int:
    days = (plan.until - plan.since).days + 1
    calls = -(-days * ADS_PER_ACCOUNT // PAGE_SIZE)
    if plan.catalog:
        calls += -(-ADS_PER_ACCOUNT // PAGE_SIZE)
    return calls


def simulate(n_accounts: int, hours: int = 48, idle_share: float = 0.0) -> dict:
    """Tick the planner over `hours`; report the last 24 hours (a steady day).

    The last `idle_share` of the accounts are idle the whole time; `populations` holds
    Meta calls per account-day and the oldest today of each population.
    """
    n_idle = round(n_accounts * idle_share)
    idle = [index >= n_accounts - n_idle for index in range(n_accounts)]
    states = [
        backfilled_state(index, START, IDLE if idle[index] else ACTIVE)
        for index in range(n_accounts)
    ]
    calls_by_population: Counter[bool] = Counter()
    age_by_population = {False: timedelta(0), True: timedelta(0)}
    runs: list[list[SyncRun]] = [list(state.runs) for state in states]
    steady_from = START + timedelta(hours=hours - 24)
    next_check = [START] * n_accounts
    waves = 0
    syncs: Counter[str] = Counter()
    calls = 0
    worst_age = timedelta(0)
    busy_until = START
    now = START
    wave_number = 0
    recording_live = 0
    while now < START + timedelta(hours=hours):
        if now >= busy_until:
            due = []
            for index, state in enumerate(states):
                # A plan only changes with a new run or when its due time comes.
                if now < next_check[index]:
                    continue
                plan = cadence.plan(state, now)
                if plan.kind in ("live", "daily", "weekly") and plan.is_due(now):
                    due.append((index, plan))
                else:
                    next_check[index] = plan.due_at or now + TICK
            if due:
                wave_number += 1
                busy_until = now + timedelta(seconds=len(due) * WAVE_SECONDS_PER_ACCOUNT)
                for index, plan in due:
                    run = SyncRun(
                        run_id=f"w{wave_number}",
                        kind=plan.kind,
                        since=plan.since,
                        until=plan.until,
                        started_at=now,
                        finished_at=busy_until,
                        outcome="ok",
                        catalog=plan.catalog,
                    )
                    runs[index].append(run)
                    next_check[index] = now
                    states[index] = AccountState(
                        **{**states[index].__dict__, "runs": runs[index]}
                    )
                    if now >= steady_from:
                        syncs[plan.kind] += 1
                        calls += meta_calls(plan)
                        calls_by_population[idle[index]] += meta_calls(plan)
                        if plan.kind == "live" and in_recording_block(
                            now, states[index].timezone
                        ):
                            recording_live += 1
                if now >= steady_from:
                    waves += 1
        if now >= steady_from and now.minute % 5 == 0:
            for index, state in enumerate(states):
                synced = cadence.today_synced_at(state)
                age = now - synced if synced else timedelta(days=1)
                worst_age = max(worst_age, age)
                age_by_population[idle[index]] = max(age_by_population[idle[index]], age)
        now += TICK
    return {
        "accounts": n_accounts,
        "waves_per_day": waves,
        "syncs_per_day": dict(syncs),
        "recording_live_per_day": recording_live,
        "meta_calls_per_account_day": calls / n_accounts,
        "reference_calls_per_account_day": reference_calls(),
        "worst_today_age_minutes": worst_age.total_seconds() / 60,
        "populations": {
            name: {
                "accounts": count,
                "meta_calls_per_account_day": calls_by_population[is_idle] / count,
                "worst_today_age_minutes": age_by_population[is_idle].total_seconds() / 60,
            }
            for name, is_idle, count in (
                ("active", False, n_accounts - n_idle), ("idle", True, n_idle)
            )
            if count
        },
    }


def print_populations(n_accounts: int, idle_share: float) -> None:
    """Meta calls per account-day of the active and the idle accounts, beside their goals."""
    simulated = simulate(n_accounts, idle_share=idle_share)
    reference = simulated["reference_calls_per_account_day"]
    goals = {"active": reference, "idle": reference / 2}
    for name, figures in simulated["populations"].items():
        calls = figures["meta_calls_per_account_day"]
        print(
            f"{name} accounts ({figures['accounts']} of {n_accounts}): "
            f"Meta calls/account-day {calls:.1f} (goal <= {goals[name]:.1f}: "
            f"{'met' if calls <= goals[name] + 1e-9 else 'MISSED'}), "
            f"oldest today {figures['worst_today_age_minutes']:.0f} min"
        )


def reference_calls() -> float:
    """Rastro's reference: 32 live reads of 2 days, a daily 7-day read with the catalog,
    one weekly 28-day read instead of a daily every seventh day."""
    live = -(-2 * ADS_PER_ACCOUNT // PAGE_SIZE)
    catalog = -(-ADS_PER_ACCOUNT // PAGE_SIZE)
    daily = -(-7 * ADS_PER_ACCOUNT // PAGE_SIZE) + catalog
    weekly = -(-28 * ADS_PER_ACCOUNT // PAGE_SIZE) + catalog
    return (24 * 60 / 45 - 1) * live + (6 * daily + weekly) / 7


# -- Part 2: measured cost of real wave runs -------------------------------------------


@contextlib.contextmanager
def instance_storage(backend: str, home: Path):
    """`home`'s dagster.yaml for `backend`; yields the environment the runs need and a
    `Storage` that reads its size and its server's CPU."""
    import yaml

    config: dict = {"telemetry": {"enabled": False}}
    if backend == "sqlite":
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        yield {}, Storage(home)
        return
    from rastro_assets_tests.postgres_server import postgres_server

    scaled = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    config["storage"] = scaled["storage"]
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with postgres_server() as server:
        yield server.env(), Storage(home, server)


class Storage:
    """The instance's size on disk (SQLite) or in its database (Postgres), and the CPU of the
    Postgres server: the postmaster's own and its reaped backends' (one a connection)."""

    def __init__(self, home: Path, server=None) -> None:
        self.home, self.server = home, server

    def size(self) -> int:
        if self.server is None:
            return directory_bytes(self.home)
        with contextlib.closing(self.server.connect()) as con, con.cursor() as cursor:
            cursor.execute("SELECT pg_database_size(current_database())")
            return int(cursor.fetchone()[0])

    def server_cpu(self) -> float:
        return server_cpu(self.server)


def server_cpu(server) -> float:
    """CPU seconds of a PostgreSQL server so far: the postmaster's and its reaped backends'."""
    if server is None:
        return 0.0
    pid_file = server.log.parent / "data" / "postmaster.pid"
    pid = int(pid_file.read_text().splitlines()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def warehouse_on(engine: str, directory: Path):
    """A migrated, empty warehouse on `engine`, the variables a run needs to reach it, and
    the PostgreSQL server holding it (None for the DuckDB file)."""
    from rastro_assets.warehouse.connection import Warehouse

    if engine == "duckdb":
        warehouse = Warehouse(directory / "rastro.duckdb")
        warehouse.migrate()
        yield warehouse, {"RASTRO_DUCKDB_PATH": str(warehouse.path)}, None
        return
    from rastro_assets.warehouse.postgres import PostgresWarehouse
    from rastro_assets_tests.postgres_server import WarehouseServer, postgres_server

    with postgres_server("warehouse") as server:
        url = WarehouseServer(server).url()
        warehouse = PostgresWarehouse(url)
        warehouse.migrate()
        # The snapshot still goes to a file beside where the DuckDB one would be.
        env = {"RASTRO_WAREHOUSE_URL": url,
               "RASTRO_DUCKDB_PATH": str(directory / "rastro.duckdb"),
               "RASTRO_ANALYTICS_PATH": str(directory / "analytics.duckdb")}
        try:
            yield warehouse, env, server
        finally:
            warehouse.close()


def measure_waves(sizes: list[int], kinds: list[str], backend: str = "sqlite",
                  event_batch_size: int = 0, warehouse_engine: str = "duckdb") -> dict:
    from rastro_assets.vault import Vault, generate_key
    from rastro_assets.warehouse import link_store, registry, site_store
    from rastro_fake_graph.server import serve
    from rastro_fake_graph.world import FakeWorld, MutableClock

    results = {}
    token = "EAAbenchTOKENc4d3nc3"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        clock = MutableClock(recording_instant(datetime.now(UTC)) - timedelta(hours=3))
        world = FakeWorld(clock=clock, seed=3)
        n = max(sizes)
        for index in range(n):
            world.add_account(
                f"act_{index + 1}",
                timezone=TIMEZONES[index % len(TIMEZONES)],
                currency="USD",
                n_ads=ADS_PER_ACCOUNT,
                token=token,
            )
        key = generate_key()
        vault = Vault.from_env({"RASTRO_SECRETS_KEY": key})
        stack = contextlib.ExitStack()
        warehouse, warehouse_env, warehouse_server = stack.enter_context(
            warehouse_on(warehouse_engine, tmp_path)
        )
        now = datetime.now(UTC)
        with warehouse.connect() as con:
            site_store.add_site(con, "s1", "Bench", now)
            registry.save_connection(con, "c1", vault.seal("c1", token), now)
            for index in range(n):
                link_store.link_account(
                    con,
                    "s1",
                    f"act_{index + 1}",
                    "c1",
                    TIMEZONES[index % len(TIMEZONES)],
                    "USD",
                    now,
                )
        home = tmp_path / "home"
        home.mkdir()
        with stack, instance_storage(backend, home) as (storage_env, storage), \
                serve(world) as server:
            env = {
                **{key: value for key, value in os.environ.items()
                   if key not in ("RASTRO_WAREHOUSE_URL", "RASTRO_ANALYTICS_PATH")},
                **storage_env,
                **warehouse_env,
                "DAGSTER_HOME": str(home),
                "RASTRO_META_GRAPH_URL": server.base_url,
                "RASTRO_SECRETS_KEY": key,
                # Waves here follow each other within seconds: their publishes are measured
                # apart (`publish_cpu`) and counted at the cadence's pace in the model.
                "RASTRO_ANALYTICS_LAG_SECONDS": "604800",
            }
            env.pop("DAGSTER_EVENT_BATCH_SIZE", None)
            if event_batch_size:
                env["DAGSTER_EVENT_BATCH_SIZE"] = str(event_batch_size)
            # Live waves record changed days only in the first 45 minutes of each
            # three-hour local block: measured once at an instant where no account
            # is in one, once where half are; the model weighs them as the day does.
            off_block = recording_instant(clock() + timedelta(hours=1), most=False)
            in_block = recording_instant(off_block + timedelta(minutes=60))
            for day, kind in enumerate(kinds):
                # Each kind a day later, at the same local times: time never runs back, or
                # the spend writer would refuse a wave that started before the last one.
                later = timedelta(days=day)
                for size in sizes:
                    # The first wave writes every row; the cadence's steady state is the
                    # next one, 45 minutes on, where only what Meta changed is written.
                    for label, instant in [
                        (kind, off_block + later), (f"{kind}+recording", in_block + later)
                    ]:
                        if kind == "daily" and label != kind:
                            continue
                        clock.set(instant - cadence.LIVE_INTERVAL)
                        run_wave(world, env, home, size, kind, storage, warehouse_server)
                        clock.set(instant)
                        results[(label, size)] = run_wave(
                            world, env, home, size, kind, storage, warehouse_server
                        )
                        results[(label, size)]["recording"] = sum(
                            in_recording_block(instant, TIMEZONES[index % len(TIMEZONES)])
                            for index in range(size)
                        )
                        results[(label, size)]["publish_cpu"] = publish_cpu(
                            warehouse, Path(env["RASTRO_DUCKDB_PATH"]), warehouse_server
                        )
            results["bytes_per_materialization"] = bytes_per_materialization(
                home, storage, env
            )
    return results


def run_wave(world, env: dict, home: Path, size: int, kind: str, storage: Storage,
             warehouse_server=None) -> dict:
    days = {"live": 2, "daily": 7}[kind]
    syncs = []
    for index in range(size):
        account = f"act_{index + 1}"
        today = world.today(account)
        syncs.append(
            {
                "ad_account_id": account,
                "kind": kind,
                "since": str(today - timedelta(days=days - 1)),
                "until": str(today),
                "catalog": kind == "daily",
            }
        )
    config = home / "wave.json"
    # Sealed as the sensor seals its waves, with the run's key: only those record the
    # cadence's kinds.
    key = derived_key(SEAL_LABEL, {"RASTRO_SECRETS_KEY": env["RASTRO_SECRETS_KEY"]})
    sealed = sealed_wave_config(syncs, world.now(), key)
    config.write_text(json.dumps({
        "ops": {"sync_wave": {"config": sealed}},
        "resources": {"rastro": {"config": {"fixed_now": world.now().isoformat()}}},
    }))
    before_bytes = storage.size()
    before_server = storage.server_cpu()
    before_warehouse = server_cpu(warehouse_server)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    completed = subprocess.run(
        [
            str(Path(sys.executable).parent / "dagster"),
            "job",
            "execute",
            # The product's location takes no clock from run config; this one binds the
            # resource whose clock the config pins at the simulated world's instant.
            "-m",
            "rastro_assets_tests.pinned",
            "-a",
            "pinned_location",
            "-j",
            "meta_sync_wave",
            "-c",
            str(config),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise SystemExit(completed.stderr[-3000:])
    run_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    storage_cpu = storage.server_cpu() - before_server
    warehouse_cpu = server_cpu(warehouse_server) - before_warehouse
    return {
        "cpu_seconds": run_cpu + storage_cpu + warehouse_cpu,
        "run_cpu_seconds": run_cpu,
        "server_cpu_seconds": storage_cpu,
        "warehouse_cpu_seconds": warehouse_cpu,
        "wall_seconds": wall,
        "storage_bytes": storage.size() - before_bytes,
    }


def publish_cpu(warehouse, pipeline_path: Path, warehouse_server=None) -> float:
    """CPU seconds of one analytics snapshot publish carrying the wave just run (this
    process's, and the warehouse server's when there is one)."""
    from rastro_assets.analytics.publish import Publisher

    publisher = Publisher(warehouse, pipeline_path.with_name("analytics.duckdb"))
    before, before_server = resource.getrusage(resource.RUSAGE_SELF), server_cpu(warehouse_server)
    publisher.publish()
    after, after_server = resource.getrusage(resource.RUSAGE_SELF), server_cpu(warehouse_server)
    return (
        (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        + after_server - before_server
    )


def bytes_per_materialization(home: Path, storage: Storage, env: dict) -> float:
    """Instance bytes (on disk, or the Postgres database's size) per materialization event,
    run overhead included."""
    import dagster as dg

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update({key: value for key, value in env.items() if key.startswith("DAGSTER_PG")})
    with dg.DagsterInstance.from_config(str(home)) as instance:
        events = 0
        for asset_key in instance.get_asset_keys():
            cursor = None
            while True:
                page = instance.fetch_materializations(asset_key, limit=10_000, cursor=cursor)
                events += len(page.records)
                if not page.has_more:
                    break
                cursor = page.cursor
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return storage.size() / max(events, 1)


def directory_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def fit(small: dict, large: dict, small_n: int, large_n: int, key: str) -> tuple[float, float]:
    per_account = (large[key] - small[key]) / (large_n - small_n)
    return small[key] - per_account * small_n, per_account


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller waves, 1,000 accounts only")
    parser.add_argument(
        "--idle-share", type=float, default=0.5,
        help="share of idle accounts in the mixed population of part 1 (default 0.5)",
    )
    parser.add_argument(
        "--simulate-only", action="store_true",
        help="part 1 alone: the simulated day's Meta calls, no Dagster runs",
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite",
                        help="the runs' instance storage (postgres: docs/dagster.scaled.yaml's)")
    parser.add_argument("--event-batch-size", type=int, default=0,
                        help="DAGSTER_EVENT_BATCH_SIZE in the runs' environment (0: unset)")
    parser.add_argument("--warehouse", choices=("duckdb", "postgres"), default="duckdb",
                        help="postgres: part 2 on the DuckDB file, then on a PostgreSQL"
                             " warehouse, side by side")
    args = parser.parse_args()
    if not 0 < args.idle_share < 1:
        parser.error("--idle-share must be between 0 and 1")
    if args.simulate_only:
        print_populations(1000, args.idle_share)
        return
    sizes = [5, 40] if args.quick else [10, 100]
    engines = ["duckdb", "postgres"] if args.warehouse == "postgres" else ["duckdb"]
    summaries = {}
    for engine in engines:
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"warehouse {engine}, storage {args.backend}, DAGSTER_EVENT_BATCH_SIZE "
              f"{args.event_batch_size or 'unset'}, load {load}", flush=True)
        measured = measure_waves(
            sizes, ["live", "daily"], args.backend, args.event_batch_size, engine
        )
        summaries[engine] = report(measured, sizes, args)
    if len(engines) > 1:
        print_side_by_side(summaries)
    print_populations(1000, args.idle_share)
    print(f"load at the end {' '.join(f'{value:.1f}' for value in os.getloadavg())}")


def report(measured: dict, sizes: list[int], args: argparse.Namespace) -> dict:
    """Print one engine's measured waves and its modelled day; the figures side by side."""
    bytes_per_event = measured.pop("bytes_per_materialization")
    small, large = sizes
    fixed_cpu, live_cpu = fit(
        measured[("live", small)], measured[("live", large)], small, large, "cpu_seconds"
    )
    _, daily_cpu = fit(
        measured[("daily", small)], measured[("daily", large)], small, large, "cpu_seconds"
    )
    _, live_bytes = fit(
        measured[("live", small)], measured[("live", large)], small, large, "storage_bytes"
    )
    # Batched, a live sync costs less than the noise in a run's fixed cost; a negative
    # fit would flatter the total, so it counts as zero.
    live_cpu = max(live_cpu, 0.0)
    recording = measured[("live+recording", large)]
    extra_per_recording = (
        recording["cpu_seconds"] - measured[("live", large)]["cpu_seconds"]
    ) / max(recording["recording"], 1)
    print(
        f"measured wave run: fixed {fixed_cpu:.2f} CPU s; per live sync {live_cpu * 1000:.0f} ms, "
        f"per daily sync {daily_cpu * 1000:.0f} ms; a live sync that records its changed "
        f"days {extra_per_recording * 1000:.0f} ms more; "
        f"storage per live sync {live_bytes / 1024:.1f} KB"
    )
    for (kind, size), figures in sorted(measured.items()):
        print(
            f"  {kind:14} wave of {size:4} accounts ({figures['recording']} recording): "
            f"{figures['cpu_seconds']:.2f} CPU s (run {figures['run_cpu_seconds']:.2f}, "
            f"storage server {figures['server_cpu_seconds']:.2f}, "
            f"warehouse server {figures['warehouse_cpu_seconds']:.2f}), "
            f"{figures['wall_seconds']:.1f} s wall, "
            f"{figures['storage_bytes'] / 1024:.0f} KB"
        )
    total_cpu = max(sum(f["cpu_seconds"] for f in measured.values()), 1e-9)
    server_share = sum(f["server_cpu_seconds"] for f in measured.values()) / total_cpu
    warehouse_share = sum(f["warehouse_cpu_seconds"] for f in measured.values()) / total_cpu
    if args.backend == "postgres":
        print(f"of the measured waves' CPU, {server_share:.0%} was the Postgres server's")
    if warehouse_share:
        print(f"of the measured waves' CPU, {warehouse_share:.0%} was the warehouse server's")
    # At steady state retention keeps the latest materialization of each account-day
    # partition per asset (plus the runs younger than the retention age, which turn over).
    steady_kb = 2 * bytes_per_event / 1024
    print(
        f"storage at steady state with retention: {steady_kb:.1f} KB per account-day "
        f"({bytes_per_event / 1024:.1f} KB per materialization on disk, run overhead included)"
    )
    # A run that wrote publishes at its end when the last publish is older than half the
    # lag (150 s by default): at most one publish per run, and never more than 576 a day.
    per_publish = max(
        measured[("live", large)]["publish_cpu"], measured[("daily", large)]["publish_cpu"]
    )
    print(
        f"analytics snapshot publish after a wave of {large} accounts: {per_publish:.2f} CPU s"
        " (the larger of a live and a daily wave's)"
    )
    per_account_day = {}
    for n in [1000] if args.quick else [100, 1000, 5000]:
        simulated = simulate(n)
        syncs = simulated["syncs_per_day"]
        cpu = (
            simulated["waves_per_day"] * fixed_cpu
            + syncs.get("live", 0) * live_cpu
            + simulated["recording_live_per_day"] * extra_per_recording
            + (syncs.get("daily", 0) + syncs.get("weekly", 0)) * daily_cpu
            + min(simulated["waves_per_day"], 576) * per_publish
        ) / n
        per_account_day[n] = cpu
        print(
            f"{n:5} accounts: {simulated['waves_per_day']} Dagster runs/day, syncs {syncs} "
            f"({simulated['recording_live_per_day']} live ones recording), "
            f"Meta calls/account-day {simulated['meta_calls_per_account_day']:.1f} "
            f"(reference {simulated['reference_calls_per_account_day']:.1f}), "
            f"CPU s/account-day {cpu:.2f}, "
            f"oldest today {simulated['worst_today_age_minutes']:.0f} min"
        )
        if n == 1000:
            summary_1000 = simulated
    cpu = per_account_day[1000]
    print(
        f"cadence: {cpu:.2f} CPU s/account-day, {steady_kb:.1f} KB/account-day, "
        f"{summary_1000['meta_calls_per_account_day']:.1f} Meta calls/account-day, "
        f"today <= {summary_1000['worst_today_age_minutes']:.0f} min at 1,000 accounts "
        f"(goal <= 1 CPU s, <= 50 KB, <= "
        f"{summary_1000['reference_calls_per_account_day']:.1f} calls, <= 50 min)",
        flush=True,
    )
    return {
        "fixed CPU s a wave run": fixed_cpu,
        "ms a live sync": live_cpu * 1000,
        "ms a daily sync": daily_cpu * 1000,
        "ms more a recording live sync": extra_per_recording * 1000,
        "CPU s a publish": per_publish,
        "warehouse server's share of the waves' CPU": warehouse_share,
        **{f"CPU s/account-day at {n:,} accounts": value for n, value in per_account_day.items()},
    }


def print_side_by_side(summaries: dict[str, dict]) -> None:
    engines = list(summaries)
    width = max(len(name) for name in summaries[engines[0]])
    print(f"{'':{width}}  " + "  ".join(f"{engine:>10}" for engine in engines))
    for name in summaries[engines[0]]:
        cells = []
        for engine in engines:
            value = summaries[engine][name]
            cells.append(f"{value:>10.0%}" if "share" in name else f"{value:>10.2f}")
        print(f"{name:{width}}  " + "  ".join(cells))
    print("goal: <= 1 CPU s an account-day at 1,000 accounts on each engine", flush=True)


if __name__ == "__main__":
    main()
