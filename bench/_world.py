"""Shared setup of the benchmarks: a big fake Meta account served over loopback, a linked
warehouse and a Syncer, as the tests build them (rastro_assets_tests/conftest.py).

The fake Graph runs in its own process (`serve_world`), so its CPU time does not share the
benchmark's GIL, and it answers from pre-rendered pages:

- every ad of the account delivers every day (the bench process sets the fake's
  `DELIVERY_SHARE` to 1 and `VANISH_SHARE` to 0 and makes every ad ACTIVE, in its own
  memory: nothing under rastro_fake_graph is edited);
- `world.rows` is memoised per day, and the JSON items of an insights query are rendered once
  per query instead of once per page (the fake re-renders the whole range for every page,
  which costs O(rows of the range) per page: it would dominate a 180,000-row backfill);
- GET insights answers are cached byte for byte, keyed by method, URL and Authorization, so a
  second pass over the same requests costs the server only HTTP handling. Benchmarks warm the
  cache with one pass and measure the sync and the floor on the same warm server. A cached
  answer spends none of the fake's rate limits and repeats its usage headers: only a request
  asked again word for word meets it (onboarding's syncs ask each range once).

Run as a script (`python bench/_world.py serve ...`) it is that server: it prints the limit
model it enforces (`LIMITS <text>` lines), then `PORT <n>`, serves until its stdin closes, and
then prints `SUMMARY <json>`: the requests it answered by endpoint and the errors it refused
with, by code and subcode (`serve_world` hands both to the bench as `Server.limits` and
`Server.summary`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ACCOUNT = "act_4242"
TIMEZONE = "America/Sao_Paulo"
CURRENCY = "BRL"
TOKEN = "EAAbenchTOKENx7Qv93LmZpR2sKd81"
SEED = 11
SITES = ("s1", "s2")


def account_today() -> date:
    from rastro_assets.timekeeping import local_date

    return local_date(NOW, TIMEZONE)


def backfill_blocks(days: int = 90, block: int = 30) -> list[tuple[date, date]]:
    """The 90 days up to the account's today as the Dagster backfill runs them (30-day runs)."""
    from rastro_assets.planner.cadence import split_blocks

    today = account_today()
    return split_blocks(today - timedelta(days=days - 1), today, block)


# -- the server process --------------------------------------------------------------------


def build_world(n_ads: int, row_cap: int, system_clock: bool = False, limits=None):
    """A FakeWorld with one account whose `n_ads` ads all deliver every day.

    Its clock is pinned at NOW, or with `system_clock` the wall clock, as the end-to-end
    tests' worlds are when a real daemon (which has no pinned clock) reads them. `limits`
    is the fake's `LimitModel`, None for its default."""
    from rastro_assets.timekeeping import system_clock as wall_clock
    from rastro_fake_graph import world as world_module
    from rastro_fake_graph.world import FakeWorld, MutableClock

    world_module.DELIVERY_SHARE = 1.0
    world_module.VANISH_SHARE = 0.0
    clock = wall_clock if system_clock else MutableClock(NOW)
    world = FakeWorld(clock=clock, seed=SEED, row_cap=row_cap, limits=limits)
    world.refusals = {}
    account = world.add_account(
        ACCOUNT, timezone=TIMEZONE, currency=CURRENCY, n_ads=n_ads, token=TOKEN
    )
    for ad in account.ads.values():
        ad.effective_status = "ACTIVE"
        ad.delivers_until = None
    return world


def prerender(world) -> None:
    """Memoise the fake's per-day rows, per-query JSON items and GET insights answers."""
    from rastro_fake_graph import app, server
    from rastro_fake_graph.world import FAILURES

    original_rows = world.rows
    day_rows: dict = {}

    def rows(account, since, until, statuses):
        out = []
        day = since
        while day <= until:
            key = (account.ad_account_id, day, statuses)
            if key not in day_rows:
                day_rows[key] = original_rows(account, day, day, statuses)
            out.extend(day_rows[key])
            day += timedelta(days=1)
        return out

    world.rows = rows
    items_cache: dict = {}

    def insights(request, account):  # app._insights, rendering each query's items once
        since, until, fields, statuses = app._insights_query(request, account)
        key = (account.ad_account_id, since, until, fields, statuses)
        items = items_cache.get(key)
        if items is None:
            found = request.world.rows(account, since, until, statuses)
            if len(found) > request.world.row_cap:
                items = FAILURES["too_much_data"]
            else:
                items = [
                    app._insight_json(account, ad, day, figures, fields)
                    for ad, day, figures in found
                ]
            items_cache[key] = items
        if not isinstance(items, list):
            raise app._Answer(
                app._error(request, items.status, items.code or 1, items.message)
            )
        return app._page(request, items)

    app._insights = insights
    original_handle = server.handle
    answers: dict = {}

    def handle(world, method, url, headers, body=b"", **kwargs):
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        key = (method, url, auth)
        cached = answers.get(key)
        if cached is not None:
            return cached
        answer = original_handle(world, method, url, headers, body, **kwargs)
        if answer.status >= 400:
            tally_refusal(world, answer.body)
        elif method == "GET" and "/insights" in url and answer.fault is None:
            answers[key] = answer
        return answer

    server.handle = handle


THROTTLE_LIMITS = {
    "80000/2446079": "ads_insights",
    "80004/2446079": "ads_management",
    "17/2446079": "ad_account_score",
    "613/1487742": "ad_account_score",
    "4/1504022": "app_insights_load",
    "4/1504039": "account_insights_load",
    "4/-": "app_platform",
    "613/-": "abuse",
}
"""The limit behind each throttle error, by code/subcode (the facts page's table)."""


def tally_refusal(world, body: bytes) -> None:
    """Count an error answer in `world.refusals` by its code/subcode and the limit behind it
    ("no Graph error" when its body is none). Errors are never cached: each is counted."""
    try:
        error = json.loads(body)["error"]
        key = f"{error.get('code')}/{error.get('error_subcode', '-')}"
        key = f"{key} {THROTTLE_LIMITS[key]}" if key in THROTTLE_LIMITS else key
    except (ValueError, KeyError, TypeError):
        key = "no Graph error"
    with world.lock:
        world.refusals[key] = world.refusals.get(key, 0) + 1


class AppLoadSampler(threading.Thread):
    """The app's insights load a second, as the fake's limits see it, sampled every `every`
    seconds: its peak and how long it stood at or above 75 % and 100 % of the capacity."""

    def __init__(self, world, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.world, self.every = world, every
        self.peak_units = 0.0
        self.seconds_at = {75: 0.0, 100: 0.0}
        self.stopped = threading.Event()

    def run(self) -> None:
        ledger = getattr(self.world, "ledger", None)
        model = getattr(self.world, "limits", None)
        if ledger is None or model is None:
            return
        while not self.stopped.wait(self.every):
            with self.world.lock:
                units = ledger.app_load.total(self.world.monotonic())
            self.peak_units = max(self.peak_units, units)
            for share in self.seconds_at:
                if units >= model.app_insights_load * share / 100:
                    self.seconds_at[share] += self.every

    def figures(self) -> dict:
        return {"peak_units": round(self.peak_units, 1),
                **{f"seconds_at_{share}": seconds for share, seconds in self.seconds_at.items()}}


def summary(world, app_load: AppLoadSampler | None = None) -> dict:
    """What the server did: requests by endpoint, refusals by code/subcode and limit, and the
    app's insights load when the fake keeps one."""
    with world.lock:
        out = {"requests": dict(world.calls), "refusals": dict(world.refusals)}
    if app_load is not None and getattr(world, "ledger", None) is not None:
        out["app_load"] = app_load.figures()
    return out


def wave_account(index: int) -> str:
    """The id of the `index`th account of a wave world (bench/latency.py)."""
    return f"act_{7_000_000 + index}"


def add_wave_accounts(world, n_accounts: int, n_ads: int) -> None:
    """`n_accounts` more accounts of `n_ads` ads each, every ad ACTIVE and delivering."""
    for index in range(n_accounts):
        account = world.add_account(
            wave_account(index), timezone=TIMEZONE, currency=CURRENCY, n_ads=n_ads, token=TOKEN
        )
        for ad in account.ads.values():
            ad.effective_status = "ACTIVE"
            ad.delivers_until = None


LIMIT_OPTIONS = ("tier", "app_insights_load", "account_insights_load", "daily_active_users",
                 "limit_off")
"""The fake's limit settings a bench may choose (`serve_world(limits=...)`): the options of
`rastro_fake_graph.server.add_limit_options`; what is not chosen keeps the fake's default."""


def _serve_main(args: argparse.Namespace) -> None:
    from rastro_fake_graph.server import limit_model, serve

    world = build_world(args.ads, args.row_cap, system_clock=args.system_clock,
                        limits=limit_model(args))
    add_wave_accounts(world, args.wave_accounts, args.wave_ads)
    # Meta's latency (bench/latency.py); zero unless asked, so other benches are unchanged.
    world.request_delay_seconds = args.delay_ms / 1000
    world.async_report_seconds = args.async_seconds
    prerender(world)
    app_load = AppLoadSampler(world)
    app_load.start()
    with serve(world) as server:
        print(f"LIMITS {world.limits.describe()}", flush=True)
        print(f"PORT {server.port}", flush=True)
        sys.stdin.read()  # until the parent closes our stdin (or exits)
        app_load.stopped.set()
        print(f"SUMMARY {json.dumps(summary(world, app_load))}", flush=True)


@dataclass
class Server:
    process: subprocess.Popen
    base_url: str
    limits: str = ""
    summary: dict | None = None
    """What the server did (`summary`), read once it has stopped."""


@contextlib.contextmanager
def serve_world(
    n_ads: int,
    row_cap: int,
    *,
    delay_ms: float = 0.0,
    async_seconds: float = 0.0,
    wave_accounts: int = 0,
    wave_ads: int = 20,
    system_clock: bool = False,
    limits: dict | None = None,
) -> Iterator[Server]:
    """The fake Graph for `n_ads` ads in a child process on loopback.

    `delay_ms` holds every answer back (Meta's latency), `async_seconds` is how long an
    async report runs, `wave_accounts` adds accounts of `wave_ads` ads each, `system_clock`
    puts the world on the wall clock instead of NOW, and `limits` sets the fake's limit
    model (LIMIT_OPTIONS; unset ones keep the fake's defaults). Once the block ends, the
    server's `summary` says what it answered and refused.
    """
    chosen = {name: value for name, value in (limits or {}).items() if value is not None}
    unknown = set(chosen) - set(LIMIT_OPTIONS)
    if unknown:
        raise ValueError(f"no such limit setting: {sorted(unknown)}")
    limit_args = [
        arg
        for name, value in chosen.items()
        for each in (value if isinstance(value, list | tuple | frozenset) else [value])
        for arg in (f"--{name.replace('_', '-')}", str(each))
    ]
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "serve", "--ads", str(n_ads),
         "--row-cap", str(row_cap), "--delay-ms", str(delay_ms),
         "--async-seconds", str(async_seconds), "--wave-accounts", str(wave_accounts),
         "--wave-ads", str(wave_ads), *(["--system-clock"] if system_clock else []),
         *limit_args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    described: list[str] = []
    server = None
    try:
        line = process.stdout.readline()
        while line.startswith("LIMITS "):
            described.append(line[len("LIMITS "):].rstrip("\n"))
            line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the fake Graph did not start: {line!r}")
        from rastro_fake_graph.world import GRAPH_VERSION

        server = Server(process, f"http://127.0.0.1:{int(line.split()[1])}/{GRAPH_VERSION}",
                        limits="\n".join(described))
        yield server
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()
        if server is not None:
            reader = threading.Thread(target=_read_summary, args=(process, server), daemon=True)
            reader.start()
            reader.join(timeout=30)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _read_summary(process: subprocess.Popen, server: Server) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in process.stdout:
            if line.startswith("SUMMARY "):
                server.summary = json.loads(line[len("SUMMARY "):])


# -- the syncing side ------------------------------------------------------------------------


def linked_warehouse(directory: str | os.PathLike, sites: tuple[str, ...] = SITES[:1]):
    """A migrated warehouse in `directory` linking ACCOUNT to `sites`; (warehouse, vault)."""
    from rastro_assets.vault import ENV_VAR, Vault, generate_key
    from rastro_assets.warehouse import link_store, registry, site_store
    from rastro_assets.warehouse.connection import Warehouse

    os.environ.setdefault(ENV_VAR, generate_key())
    vault = Vault.from_env()
    warehouse = Warehouse(Path(directory) / "rastro.duckdb")
    warehouse.migrate()
    with warehouse.connect() as con:
        registry.save_connection(con, "c1", vault.seal("c1", TOKEN), NOW)
        for site in sites:
            site_store.add_site(con, site, f"Site {site}", NOW)
            link_store.link_account(con, site, ACCOUNT, "c1", TIMEZONE, CURRENCY, NOW)
    return warehouse, vault


def make_syncer(warehouse, base_url: str, transport_factory=None, page_size: int = 500,
                **client_options):
    """A Syncer reaching `base_url` with a fixed clock at NOW (one new transport a client)."""
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.sync.syncer import Syncer
    from rastro_assets.timekeeping import fixed_clock

    def client(token: str) -> MetaClient:
        transport = transport_factory() if transport_factory else None
        return MetaClient(token, base_url=base_url, transport=transport, page_size=page_size,
                          sleep=lambda seconds: None,
                          **({"async_poll_seconds": 0} | client_options))

    return Syncer(warehouse, client, clock=fixed_clock(NOW))


def run_backfill(syncer, blocks: list[tuple[date, date]], tag: str = "bench"):
    """Each block through `Syncer.sync`, as the backfill's runs do; the outcomes."""
    from rastro_assets.sync.types import SyncRequest

    outcomes = []
    for index, (since, until) in enumerate(blocks):
        outcome = syncer.sync(
            SyncRequest(ACCOUNT, since, until, kind="backfill", run_id=f"{tag}-{index}"),
            synced_at=NOW,
        )
        if not outcome.ok:
            raise RuntimeError(f"the sync of {since}..{until} failed: {outcome.error}")
        outcomes.append(outcome)
    return outcomes


def link_wave_accounts(warehouse, n_accounts: int, site: str = SITES[0]) -> None:
    """Link the wave world's first `n_accounts` accounts to `site` through connections of their
    own, w1, w2, ..., each holding the most links a connection may: an agency past that limit
    connects its token again under another name."""
    from rastro_assets.vault import Vault
    from rastro_assets.warehouse import link_store, registry

    vault = Vault.from_env()
    per_connection = link_store.MAX_LINKS_PER_CONNECTION
    with warehouse.connect() as con:
        for index in range(n_accounts):
            connection = f"w{index // per_connection + 1}"
            if index % per_connection == 0:
                registry.save_connection(con, connection, vault.seal(connection, TOKEN), NOW)
            link_store.link_account(
                con, site, wave_account(index), connection, TIMEZONE, CURRENCY, NOW
            )


def tempdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="rastro-bench-")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="serve the bench world on loopback")
    serve_parser.add_argument("--ads", type=int, default=2000)
    serve_parser.add_argument("--row-cap", type=int, default=5000)
    serve_parser.add_argument("--delay-ms", type=float, default=0.0)
    serve_parser.add_argument("--async-seconds", type=float, default=0.0)
    serve_parser.add_argument("--wave-accounts", type=int, default=0)
    serve_parser.add_argument("--wave-ads", type=int, default=20)
    serve_parser.add_argument("--system-clock", action="store_true")
    from rastro_fake_graph.server import add_limit_options

    add_limit_options(serve_parser)
    _serve_main(parser.parse_args())


def timed_into(spent: dict[str, float], name: str, fn: Callable) -> Callable:
    """`fn`, adding the wall seconds of each call to `spent[name]`."""
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
    return wrapper


def workspace_context(instance):
    """The code location loaded in this process, as `dagster-webserver` serves it."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget

    return WorkspaceProcessContext(
        instance,
        ModuleTarget(
            module_name="rastro_assets.definitions",
            attribute=None,
            working_directory=str(REPO),
            location_name="rastro_assets",
        ),
    )


def resync_runs_sql(days: str, where: str) -> str:
    """`meta_sync_runs` rows of the re-syncs from 04:02 local, as a SELECT for an INSERT.

    Each day of `days` (a query of `act, tz, d, day`) gets the daily re-sync (7 days and the
    catalog), every seventh one the weekly (28 days); `where` filters on `started_at`. The
    statement's `$linked` parameter is each row's `token_sealed_at` (the token of the link).
    """
    return f"""
            SELECT kind || '-' || d, act, kind,
                   day - CASE kind WHEN 'weekly' THEN 27 ELSE 6 END, day, started_at,
                   started_at + INTERVAL 90 SECOND, 'ok', 9000, 3, 30, NULL, true, 8.0,
                   NULL, NULL, $linked
            FROM (
                SELECT act, d, day, timezone(tz, day + TIME '04:02:00') AS started_at,
                       CASE WHEN d % 7 = 3 THEN 'weekly' ELSE 'daily' END AS kind
                FROM ({days})
            )
            WHERE {where}"""
