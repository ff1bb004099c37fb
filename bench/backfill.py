"""Backfill throughput: a 90-day backfill through the sync core against its physical floor.

Setup: the fake Graph in a child process on loopback (real sockets, pre-rendered pages: see
bench/_world.py), one account (America/Sao_Paulo, BRL) with 2,000 ads that all deliver every
day: 180,000 ad-days. The sync runs `Syncer.sync` over the three 30-day ranges the Dagster
backfill runs (BackfillPolicy.multi_run(30)), page size 500, into a fresh warehouse each time.
The fake's row_cap stays at its default (5,000 rows a request), so the client splits each
30-day range as Meta makes it (30 -> 15 -> 8/7 -> 4/3 -> 2/1 days) and reads 2-day ranges of
4,000 rows: the "too much data" answers are part of the sync's requests.

The floor: the exact request sequence of the sync (same URLs, params, page size, token header,
the refused probes included), replayed with one httpx client, `json.loads` on each body and
nothing more. Both run against the same warm server; the first (cold) sync only warms it.

Run: .venv/bin/python bench/backfill.py [--rounds 3] [--ads 2000] [--breakdown]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402
import httpx  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RecordingTransport(httpx.HTTPTransport):
    """An httpx transport that notes every request it sends."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.log.append((request.method, str(request.url), request.read()))
        return super().handle_request(request)


def sync_once(base_url: str, blocks, log: list | None = None) -> tuple[float, int, int]:
    """(seconds, rows written, api calls) of a fresh backfill."""
    factory = (lambda: RecordingTransport(log)) if log is not None else None
    with _world.tempdir() as directory:
        warehouse, _ = _world.linked_warehouse(directory)
        syncer = _world.make_syncer(warehouse, base_url, transport_factory=factory)
        started = time.perf_counter()
        outcomes = _world.run_backfill(syncer, blocks)
        elapsed = time.perf_counter() - started
    rows = sum(outcome.rows_written for outcome in outcomes)
    calls = sum(outcome.api_calls for outcome in outcomes)
    return elapsed, rows, calls


def floor_once(requests: list) -> tuple[float, int]:
    """(seconds, insights rows) of downloading the same requests and json.loads on them."""
    rows = 0
    started = time.perf_counter()
    with httpx.Client(timeout=60, headers={"User-Agent": "rastro-assets"}) as http:
        auth = {"Authorization": f"Bearer {_world.TOKEN}"}
        for method, url, body in requests:
            response = http.request(method, url, headers=auth, content=body or None)
            if not response.headers.get("content-type", "").startswith("application/json"):
                continue  # a thumbnail the last block fetched with the catalog: downloaded only
            data = json.loads(response.content).get("data")
            rows += len(data) if isinstance(data, list) and "/insights" in url else 0
    return time.perf_counter() - started, rows


def breakdown(base_url: str, blocks) -> None:
    """One more sync with timers around its parts (wrapped in this process only)."""
    import contextlib

    import duckdb

    from rastro_assets.meta import insights, session
    from rastro_assets.sync import spend_write, syncer
    from rastro_assets.warehouse import connection

    spent: dict[str, float] = {}

    def timed(name, fn):
        return _world.timed_into(spent, name, fn)

    nested = "  of which: insights pages read from bytes"
    patches = [
        (session.GraphSession, "_once", "HTTP request + decode + usage headers"),
        (insights, "read_insights_page", nested),
        (insights, "parse_insight_table", "parse pages json.loads decoded (per-row reference)"),
        (spend_write, "write_spend_many", "write_spend_many"),
        (spend_write, "upsert_spend_names", "upsert_spend_names (catalog.py)"),
        (syncer.Syncer, "catalog_after_spend", "catalog after spend (sync/catalog.py)"),
        (connection.duckdb, "connect", "duckdb.connect (opening the file)"),
    ]
    with contextlib.ExitStack() as stack:
        for owner, attribute, name in patches:
            original = getattr(owner, attribute)
            setattr(owner, attribute, timed(name, original))
            stack.callback(setattr, owner, attribute, original)
        total, _, _ = sync_once(base_url, blocks)
    del duckdb
    print(f"breakdown of one more sync ({total:.2f} s):")
    for name in [name for _, _, name in patches if name in spent]:  # nested after its caller
        print(f"  {name:45s} {spent[name]:6.2f} s")
    print(f"  {'the rest (closing connections, sync core, ...)':45s} "
          f"{total - sum(spent.values()) + spent.get(nested, 0.0):6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ads", type=int, default=2000)
    parser.add_argument("--row-cap", type=int, default=5000)
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the parts of one more sync")
    args = parser.parse_args()
    blocks = _world.backfill_blocks()
    print(f"account {_world.ACCOUNT}: {args.ads} ads x 90 days, row_cap {args.row_cap}, "
          f"ranges {', '.join(f'{a}..{b}' for a, b in blocks)}")
    with _world.serve_world(args.ads, args.row_cap) as server:
        log: list = []
        cold, rows, calls = sync_once(server.base_url, blocks, log)
        refused = sum(1 for _, url, _ in log if "after=" not in url) - len(blocks)
        print(f"warm-up sync (cold server): {cold:.2f} s, {rows} rows, {calls} calls "
              f"({len(log)} requests, {refused} more first pages than ranges: split probes)")
        syncs, floors, sync_cpu, floor_cpu = [], [], [], []
        for round_ in range(args.rounds):
            cpu = cpu_seconds()
            floor_s, floor_rows = floor_once(log)
            floor_cpu.append(cpu_seconds() - cpu)
            cpu = cpu_seconds()
            sync_s, sync_rows, _ = sync_once(server.base_url, blocks)
            sync_cpu.append(cpu_seconds() - cpu)
            floors.append(floor_s)
            syncs.append(sync_s)
            print(f"round {round_ + 1}: floor {floor_s:.2f} s ({floor_rows} rows, "
                  f"{floor_cpu[-1]:.2f} CPU s), sync {sync_s:.2f} s ({sync_rows} rows, "
                  f"{sync_cpu[-1]:.2f} CPU s)")
            if floor_rows != rows or sync_rows != rows:
                raise SystemExit(f"row counts differ: {rows} {floor_rows} {sync_rows}")
        if args.breakdown:
            breakdown(server.base_url, blocks)
    best_sync, best_floor = min(syncs), min(floors)
    print(f"floor: {rows / best_floor:,.0f} rows/s (best of {args.rounds})")
    print(f"sync:  {rows / best_sync:,.0f} rows/s (best of {args.rounds})")
    print(f"client CPU (this process, all threads): floor {min(floor_cpu):.2f} s, "
          f"sync {min(sync_cpu):.2f} s ({min(sync_cpu) / min(floor_cpu):.2f}x); load average "
          f"{os.getloadavg()[0]:.1f} on 2 cores")
    print(f"backfill: {best_sync / best_floor:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
