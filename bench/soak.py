"""Soak: many accounts over a compressed simulated week on the fake Graph, with random faults.

The planner (`cadence.plan` over `planned_accounts`, as the sensors ask it) runs on an
injected clock that jumps a tick at a time; every sync it finds due runs in-process through
`Syncer` against the fake Graph (backfills and gaps in 30-day blocks, as the partition
backfills run them). Meanwhile Meta misbehaves at random: throttling, permission errors,
5xx pages, malformed JSON, timeouts, dropped connections, too much data, catalog and
thumbnail failures, a connection's token dying and being reconnected hours later, and run
processes that die right after starting (their row never finishes; the planner must wait out
the lease). Once a simulated day, `prune_sync_runs` trims `meta_sync_runs`.

At the end, every account-day of every account (from the first backfill day to its local
today) is compared with the fake's truth *as Meta answered at the instant that day was last
read completely* (the fake is a pure function of its clock, so that answer is reproduced
exactly). Any stored row that differs, is missing or is extra is a difference; so is a day
never read completely unless its account is still inside a back-off, paused, or owes a
backfill. `site_spend_daily` must equal the sums of `ad_spend_daily` too.

Reported: syncs by kind and outcome, faults injected, Meta calls, wall time, memory (RSS at the
end and peak, per process), open file descriptors, the DuckDB files' size, and
`meta_sync_runs` rows at the end and at their largest before a prune.

The accounts are split into `--processes` shards (default 2, one per core), each a process
with its own warehouse, fake Graph and planner clock: DuckDB and the fake are CPU-bound, and a
single process would use one core. Within a shard, each look's due syncs run four at a time on
one held warehouse, as a sync wave runs them.

Defaults: --accounts 500 --days 7 --tick-minutes 720 (two looks a simulated day) --ads 4
--fault-rate 0.05 --retention-days 3 --seed 1 --processes 2 --concurrency 4
--duckdb-threads 1: about 7,900 syncs; measured 247 s on 2 quiet cores, 445 s on 2 busy ones.
Run: .venv/bin/python bench/soak.py [--accounts N] [--days D] [--tick-minutes M]
The last line is `soak: <N> differences (goal 0)`.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rastro_assets.meta.client import MetaClient  # noqa: E402
from rastro_assets.planner import cadence  # noqa: E402
from rastro_assets.planner.history import planned_accounts  # noqa: E402
from rastro_assets.planner.rules import GAP_AFTER  # noqa: E402
from rastro_assets.sync.syncer import Syncer  # noqa: E402
from rastro_assets.sync.types import SyncRefused, SyncRequest  # noqa: E402
from rastro_assets.timekeeping import days_between, local_date  # noqa: E402
from rastro_assets.vault import Vault  # noqa: E402
from rastro_assets.warehouse import link_store, registry, site_store  # noqa: E402
from rastro_assets.warehouse.connection import Warehouse  # noqa: E402
from rastro_assets.warehouse.runs import SyncRunStart, prune_sync_runs, start_sync_runs  # noqa: E402
from rastro_fake_graph.app import FakeGraphTransport  # noqa: E402
from rastro_fake_graph.world import FakeWorld, MutableClock  # noqa: E402

START = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)
TIMEZONES = (
    "America/Los_Angeles", "America/New_York", "America/Sao_Paulo", "Europe/London",
    "Europe/Berlin", "Asia/Kolkata", "Asia/Tokyo", "Pacific/Auckland",
)
CURRENCIES = ("USD", "USD", "BRL", "GBP", "EUR", "USD", "JPY", "USD")
ACCOUNTS_PER_CONNECTION = 25
ACCOUNTS_PER_SITE = 5
BACKFILL_KINDS = ("backfill", "gap")
# (weight, point, error, times): None times = until the tick ends.
FAULTS = (
    (6, "insights", "throttled", 1),
    (2, "insights", "throttled_17", 1),
    (3, "insights_page", "transient", 1),
    (3, "insights", "http5xx_html", 1),
    (3, "insights", "malformed_json", 2),
    (3, "insights", "dropped", 1),
    (3, "insights", "timeout", 1),
    (2, "insights", "too_much_data", 1),
    (2, "insights", "unknown_error", None),
    (2, "insights_page", "permission", 1),
    (1, "insights", "other", 1),
    (2, "ads", "http5xx_empty", None),
    (2, "thumbnail", "not_found", 1),
    (1, "ads", "throttled", 1),
)
TOKEN_DEATHS = 2  # connections whose token dies for a while during the week
DEAD_RUNS_PER_DAY = 3  # run processes that "die" right after starting, per simulated day


def token_of(connection: int) -> str:
    return f"EAAsoak{connection:04d}TOKENx7Qv93LmZpR2sKd81"


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path, indexes: range) -> None:
        self.args = args
        self.indexes = indexes
        self.rng = random.Random(f"{args.seed}-{indexes.start}")
        self.clock = MutableClock(START)
        self.world = FakeWorld(clock=self.clock, seed=args.seed)
        self.vault = Vault(os.urandom(32))
        self.warehouse = Warehouse(root / "rastro.duckdb")
        self.warehouse.migrate()
        self.accounts: list[str] = []
        self.timezones: dict[str, str] = {}
        self.connection_of: dict[str, str] = {}
        self.transport = FakeGraphTransport(self.world)
        self.syncer = Syncer(self.warehouse, self._client, vault_factory=lambda: self.vault,
                             clock=self.clock)
        # (account, day) -> the instant it was last read completely
        self.last_read: dict[tuple[str, date], datetime] = {}
        self.syncs: Counter[tuple[str, str]] = Counter()
        self.faults: Counter[str] = Counter()
        self.api_calls = 0
        self.catalog_errors = 0
        self.prunes: list[tuple[int, int]] = []
        self.dead_tokens: dict[str, datetime] = {}  # connection -> reconnect at

    def _client(self, token: str) -> MetaClient:
        return MetaClient(token, base_url="https://graph.facebook.com/v25.0",
                          transport=self.transport, sleep=lambda seconds: None,
                          page_size=100, async_poll_seconds=1.0, async_timeout_seconds=5.0)

    # -- the world ----------------------------------------------------------------------

    def build(self) -> None:
        first_day = (START - timedelta(days=120)).date()
        with self.warehouse.connect() as con:
            for index in self.indexes:
                account = f"act_{70000 + index}"
                tz = TIMEZONES[index % len(TIMEZONES)]
                currency = CURRENCIES[index % len(CURRENCIES)]
                connection = index // ACCOUNTS_PER_CONNECTION
                site = f"site{index // ACCOUNTS_PER_SITE:03d}"
                self.world.add_account(account, timezone=tz, currency=currency,
                                       n_ads=self.args.ads, token=token_of(connection),
                                       first_day=first_day)
                if index % ACCOUNTS_PER_CONNECTION == 0 or index == self.indexes.start:
                    cid = f"c{connection:03d}"
                    registry.save_connection(con, cid, self.vault.seal(cid, token_of(connection)),
                                             START)
                if index % ACCOUNTS_PER_SITE == 0 or index == self.indexes.start:
                    site_store.add_site(con, site, None, START)
                link_store.link_account(con, site, account, f"c{connection:03d}", tz, currency,
                                      START)
                self.accounts.append(account)
                self.timezones[account] = tz
                self.connection_of[account] = f"c{connection:03d}"

    # -- one tick ------------------------------------------------------------------------

    def tick(self, number: int) -> None:
        now = self.clock()
        self._reconnect_due(now)
        self._kill_tokens(number, now)
        with self.warehouse.connect() as con:
            planned = planned_accounts(con)
        due = [
            (account, plan)
            for account in planned
            if (plan := cadence.plan(account.state, now)).is_due(now) and plan.kind != "paused"
        ]
        self.rng.shuffle(due)
        for account, plan in due[: self._dead_runs(number)]:
            # A run process that dies right after writing its start: no end, ever.
            with self.warehouse.connect() as con:
                start = SyncRunStart(
                    run_id=f"dead-{number}", ad_account_id=account.state.ad_account_id,
                    kind=plan.kind, since=plan.since, until=plan.until, started_at=now,
                    catalog=plan.catalog, token_sealed_at=account.state.token_sealed_at,
                )
                start_sync_runs(con, [start])
            self.syncs[(plan.kind, "died")] += 1
        jobs = due[self._dead_runs(number):]
        for account, _ in jobs:
            self._inject_fault(account.state.ad_account_id)
        # A few accounts at a time, as a sync wave runs them (WAVE_CONCURRENCY).
        if self.args.concurrency > 1:
            with ThreadPoolExecutor(max_workers=self.args.concurrency) as pool:
                done = list(pool.map(lambda job: self._run(number, now, *job), jobs))
        else:
            done = [self._run(number, now, *job) for job in jobs]
        for results in done:
            for request, outcome in results:
                if outcome is None:
                    self.syncs[(request.kind, "refused")] += 1
                    continue
                self.syncs[(request.kind, outcome.outcome)] += 1
                self.api_calls += outcome.api_calls
                self.catalog_errors += bool(outcome.catalog_error)
                for day in outcome.complete_days:
                    self.last_read[(request.ad_account_id, day)] = now
        self.world.clear_failures()

    def _run(self, number: int, now: datetime, account, plan) -> list[tuple]:
        """One account's owed sync (a backfill or gap in 30-day blocks, as Dagster runs it)."""
        blocks = (cadence.split_blocks(plan.since, plan.until)
                  if plan.kind in BACKFILL_KINDS else [(plan.since, plan.until)])
        results = []
        for block, (since, until) in enumerate(blocks):
            request = SyncRequest(account.state.ad_account_id, since, until, kind=plan.kind,
                                  run_id=f"tick-{number}-{block}", catalog=plan.catalog)
            try:
                outcome = self.syncer.sync(request, synced_at=now)
            except SyncRefused as exc:
                print(f"refused: {exc}", file=sys.stderr)
                results.append((request, None))
                break
            results.append((request, outcome))
            if not outcome.ok:
                break
        return results

    def _dead_runs(self, number: int) -> int:
        per_tick = DEAD_RUNS_PER_DAY * self.args.tick_minutes / (24 * 60)
        return int(per_tick * (number + 1)) - int(per_tick * number) if number > 0 else 0

    def _inject_fault(self, account: str) -> None:
        if self.rng.random() >= self.args.fault_rate:
            return
        weights = [fault[0] for fault in FAULTS]
        _, point, error, times = self.rng.choices(FAULTS, weights=weights)[0]
        regain = self.rng.choice((5, 30, 90, 200))
        self.world.fail(point, error, times=times,
                        account=None if point == "thumbnail" else account,
                        regain_minutes=regain)
        self.faults[f"{point}:{error}"] += 1

    def _kill_tokens(self, number: int, now: datetime) -> None:
        ticks = self.args.days * 24 * 60 // self.args.tick_minutes
        connections = sorted(set(self.connection_of.values()))
        for death in range(TOKEN_DEATHS):
            if number == (death + 1) * ticks // (TOKEN_DEATHS + 2) and death < len(connections):
                connection = connections[(death * 7) % len(connections)]
                token = token_of(int(connection.removeprefix("c")))
                self.world.kill_token(token, subcode=self.rng.choice((460, 463, 467)))
                # Reconnected one to four looks later: some of its accounts pause first.
                looks = self.rng.choice((1.5, 2.5, 4))
                self.dead_tokens[connection] = now + timedelta(
                    minutes=looks * self.args.tick_minutes)
                self.faults["token_death"] += 1

    def _reconnect_due(self, now: datetime) -> None:
        for connection, at in list(self.dead_tokens.items()):
            if now >= at:
                token = token_of(int(connection.removeprefix("c")))
                self.world.revive_token(token)
                with self.warehouse.connect() as con:
                    registry.save_connection(con, connection,
                                             self.vault.seal(connection, token), now)
                del self.dead_tokens[connection]
                self.faults["token_reconnected"] += 1

    def prune(self) -> None:
        with self.warehouse.connect() as con:
            before = con.execute("SELECT count(*) FROM meta_sync_runs").fetchone()[0]
            prune_sync_runs(con, self.clock() - timedelta(days=self.args.retention_days), GAP_AFTER)
            after = con.execute("SELECT count(*) FROM meta_sync_runs").fetchone()[0]
        self.prunes.append((before, after))

    # -- the verdict --------------------------------------------------------------------------

    def compare(self) -> tuple[int, dict[str, int]]:
        end = self.clock()
        with self.warehouse.connect() as con:
            planned = {a.state.ad_account_id: a for a in planned_accounts(con)}
            stored: dict[tuple[str, date], set[tuple]] = defaultdict(set)
            for account, ad_id, day, spend, impressions, clicks, conversations in con.execute(
                "SELECT ad_account_id, ad_id, day, spend, impressions, clicks, conversations"
                " FROM ad_spend_daily"
            ).fetchall():
                stored[(account, day)].add((ad_id, spend, impressions, clicks, conversations))
            site_mismatches = con.execute(
                """
                SELECT count(*) FROM (
                    SELECT l.site_id, a.ad_account_id, a.day, sum(a.spend) AS spend,
                           sum(a.impressions) AS impressions, sum(a.clicks) AS clicks,
                           sum(a.conversations) AS conversations
                    FROM ad_spend_daily a JOIN site_ad_accounts l USING (ad_account_id)
                    GROUP BY ALL
                ) e FULL JOIN site_spend_daily s USING (site_id, ad_account_id, day)
                WHERE e.spend IS DISTINCT FROM s.spend
                   OR e.impressions IS DISTINCT FROM s.impressions
                   OR e.clicks IS DISTINCT FROM s.clicks
                   OR e.conversations IS DISTINCT FROM s.conversations
                """
            ).fetchone()[0]
        counts: Counter[str] = Counter()
        counts["site_spend_mismatches"] = site_mismatches
        by_instant: dict[datetime, list[tuple[str, date]]] = defaultdict(list)
        for account in self.accounts:
            tz = self.timezones[account]
            state = planned[account].state
            status = cadence.status(state, end)
            owed = cadence.plan(state, end)
            # Days the planner still owes: all of them while the account backs off, is
            # paused or backfills; else the range of its next sync (today and yesterday
            # of a live account whose local day began after its last sync, or whose
            # last run died and waits out its lease).
            pending = status.state in ("error", "paused", "backfilling") or owed.kind in (
                *BACKFILL_KINDS, "paused")
            owed_days = set() if owed.since is None else set(days_between(owed.since,
                                                                           owed.until))
            first = local_date(START, tz) - timedelta(days=cadence.BACKFILL_DAYS - 1)
            for day in days_between(first, local_date(end, tz)):
                read_at = self.last_read.get((account, day))
                if read_at is None:
                    excused = pending or day in owed_days
                    counts["never_read_pending" if excused else "never_read"] += 1
                    if not excused:
                        print(f"never read: {account} {day} ({status.state}; next:"
                              f" {owed.kind} {owed.since}..{owed.until}, {owed.reason})",
                              file=sys.stderr)
                        if stored.get((account, day)):
                            counts["rows_without_a_read"] += 1
                else:
                    by_instant[read_at].append((account, day))
        for instant, keys in by_instant.items():
            self.clock.set(instant)
            for account, day in keys:
                truth = {
                    (row.ad_id, row.spend, row.impressions, row.clicks, row.conversations)
                    for row in self.world.truth(account, day)
                }
                counts["days_compared"] += 1
                if stored.get((account, day), set()) != truth:
                    counts["days_differing"] += 1
                    if counts["days_differing"] <= 5:
                        print(f"differs: {account} {day} read at {instant}: stored "
                              f"{sorted(stored.get((account, day), set()))[:3]} truth "
                              f"{sorted(truth)[:3]}", file=sys.stderr)
        self.clock.set(end)
        differences = (counts["days_differing"] + counts["never_read"]
                       + counts["rows_without_a_read"] + site_mismatches)
        return differences, counts


def rss_kb(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def run_shard(args: argparse.Namespace, shard: int) -> dict:
    """The whole simulated week for one share of the accounts, in this process."""
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL)
    first = shard * args.accounts // args.processes
    last = (shard + 1) * args.accounts // args.processes
    wall = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rastro-soak-") as tmp:
        soak = Soak(args, Path(tmp), range(first, last))
        soak.build()
        ticks = args.days * 24 * 60 // args.tick_minutes
        with soak.warehouse.held():
            if args.duckdb_threads:
                with soak.warehouse.connect() as con:
                    con.execute(f"SET threads = {int(args.duckdb_threads)}")
            for number in range(ticks + 1):
                soak.tick(number)
                if (number + 1) * args.tick_minutes % (24 * 60) < args.tick_minutes:
                    soak.prune()
                    done = soak.clock() - START
                    print(f"  shard {shard + 1}/{args.processes} day {done.days + 1}: "
                          f"{sum(soak.syncs.values())} syncs so far, meta_sync_runs "
                          f"{soak.prunes[-1][0]} -> {soak.prunes[-1][1]} rows after pruning, "
                          f"RSS {rss_kb() // 1024} MB, {time.monotonic() - wall:.0f} s",
                          flush=True)
                if number < ticks:
                    soak.clock.advance(minutes=args.tick_minutes)
            differences, counts = soak.compare()
            with soak.warehouse.connect() as con:
                runs_rows = con.execute("SELECT count(*) FROM meta_sync_runs").fetchone()[0]
                statuses = Counter(
                    cadence.status(a.state, soak.clock()).state for a in planned_accounts(con)
                )
        open_files = len(os.listdir("/proc/self/fd"))
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 2**20
    return {
        "differences": differences,
        "counts": counts,
        "syncs": soak.syncs,
        "faults": soak.faults,
        "api_calls": soak.api_calls,
        "catalog_errors": soak.catalog_errors,
        "statuses": statuses,
        "runs_rows": runs_rows,
        "largest_runs": max((before for before, _ in soak.prunes), default=0),
        "rss_mb": rss_kb() // 1024,
        "peak_mb": rss_kb("VmHWM") // 1024,
        "open_files": open_files,
        "size_mb": size_mb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accounts", type=int, default=500)
    parser.add_argument("--days", type=int, default=7, help="simulated days")
    parser.add_argument("--tick-minutes", type=int, default=720,
                        help="simulated minutes between two looks of the planner")
    parser.add_argument("--ads", type=int, default=4, help="ads per account")
    parser.add_argument("--fault-rate", type=float, default=0.05,
                        help="share of syncs that meet an injected fault")
    parser.add_argument("--retention-days", type=float, default=3,
                        help="meta_sync_runs rows older than this are pruned daily")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2,
                        help="the accounts are split into this many shards, one process each"
                        " (its own warehouse and fake Graph), to use every core")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="syncs at once within a tick, as a wave runs them")
    parser.add_argument("--duckdb-threads", type=int, default=1,
                        help="DuckDB threads (0: DuckDB's default, one per core); the syncs'"
                        " queries are tiny, and one thread each is cheapest")
    parser.add_argument("--verbose", action="store_true", help="show the syncs' warnings")
    args = parser.parse_args(argv)
    args.processes = max(1, min(args.processes, args.accounts))

    wall = time.monotonic()
    print(f"soak: {args.accounts} accounts x {args.ads} ads, {args.days} simulated days, "
          f"a look every {args.tick_minutes} min, fault rate {args.fault_rate:.0%}, "
          f"seed {args.seed}, {args.processes} process(es)", flush=True)
    if args.processes == 1:
        shards = [run_shard(args, 0)]
    else:
        # Forked before any DuckDB file or thread exists in this process.
        with multiprocessing.get_context("fork").Pool(args.processes) as pool:
            shards = pool.starmap(run_shard, [(args, n) for n in range(args.processes)])

    def total(key: str):
        summed = Counter()
        for shard in shards:
            summed.update(shard[key])
        return summed

    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for (kind, outcome), count in total("syncs").items():
        by_kind[kind][outcome] += count
    print("syncs by kind:")
    for kind in sorted(by_kind):
        print(f"  {kind:<9} " + ", ".join(f"{o} {n}" for o, n in sorted(by_kind[kind].items())))
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(total("faults").items())))
    print(f"catalog/thumbnail errors noted: {sum(s['catalog_errors'] for s in shards)}")
    print(f"Meta calls: {sum(s['api_calls'] for s in shards)}")
    print(f"final states: {dict(sorted(total('statuses').items()))}")
    print("compared: " + ", ".join(f"{k} {v}" for k, v in sorted(total("counts").items())))
    print(f"meta_sync_runs: {sum(s['runs_rows'] for s in shards)} rows at the end (retention "
          f"{args.retention_days:g} days; largest before a prune "
          f"{sum(s['largest_runs'] for s in shards)})")
    print(f"memory per process: RSS at the end up to {max(s['rss_mb'] for s in shards)} MB, peak "
          f"up to {max(s['peak_mb'] for s in shards)} MB; open files up to "
          f"{max(s['open_files'] for s in shards)}; DuckDB files "
          f"{sum(s['size_mb'] for s in shards):.1f} MB in all")
    print(f"wall time: {time.monotonic() - wall:.0f} s")
    differences = sum(s["differences"] for s in shards)
    print(f"soak: {differences} differences (goal 0)")
    return 0 if differences == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
