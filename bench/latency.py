"""Under Meta's latency: refused probes, a backfill's wall-clock, a live wave's wall-clock.

Setup: the fake Graph in a child process on loopback (bench/_world.py) holding every answer
back by `--delay-ms` (300 ms: real Meta answers a page in 0.3-2 s).

1. Backfill: the 90-day backfill of one account with 2,000 ads that all deliver every day
   (180,000 ad-days), the fake's row cap at its default (5,000 rows a request), run as the
   Dagster backfill runs it: three 30-day syncs through `Syncer.sync`, one after another,
   into a fresh warehouse. Refused share: requests Meta answered "reduce the amount of
   data" over all insights requests (goal <= 5 %). Wall-clock against its sequential
   latency floor, requests x delay (goal <= 1/3). The first backfill warms the fake's
   caches (its figures are printed too); the second is the figure.
2. Live wave: `Syncer.sync_wave` of N accounts (20 ads each, today and yesterday, as the
   cadence's live waves), at each `--wave-concurrency`, a fresh warehouse each, after one
   warm-up wave. The goal is 5,000 accounts within 10 minutes; N defaults to 500 and the
   figure is extrapolated linearly to 5,000 (the wave's work is per account), saying so;
   `--wave 5000` measures the 5,000 themselves. The wave's accounts are linked through
   connections of 500 links each (the most one connection holds), as an agency links them.

Run: .venv/bin/python bench/latency.py [--delay-ms 300] [--wave 500]
     [--wave-concurrency 4,8,16] [--sequential]   (~4 min; --sequential adds ~2.5 min)
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402
import httpx  # noqa: E402

WAVE_GOAL_ACCOUNTS = 5_000
WAVE_GOAL_SECONDS = 600.0
REFUSED_GOAL = 0.05
FLOOR_SHARE_GOAL = 1 / 3


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Tally:
    """Insights requests and refusals over every client of a run (clients share it)."""

    def __init__(self) -> None:
        self.requests = 0
        self.insights = 0
        self.refused = 0
        self._lock = threading.Lock()

    def transport(self) -> httpx.BaseTransport:
        return _TallyTransport(self)


class _TallyTransport(httpx.HTTPTransport):
    def __init__(self, tally: Tally) -> None:
        # Plain HTTP to loopback: loading the CA bundle (~0.1 CPU s a transport) would
        # only measure this wrapper, not the product (which shares one TLS context).
        super().__init__(verify=False)
        self._tally = tally

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if "/insights" in request.url.path:
            body = response.read()
            with self._tally._lock:
                self._tally.insights += 1
                self._tally.refused += b"reduce the amount of data" in body
        with self._tally._lock:
            self._tally.requests += 1
        return response


def backfill_once(base_url: str, blocks, **client_options) -> tuple[float, Tally, int]:
    """(seconds, tally, rows written) of a fresh 90-day backfill."""
    tally = Tally()
    with _world.tempdir() as directory:
        warehouse, _ = _world.linked_warehouse(directory)
        syncer = _world.make_syncer(warehouse, base_url, transport_factory=tally.transport,
                                    **client_options)
        started = time.perf_counter()
        outcomes = _world.run_backfill(syncer, blocks)
        elapsed = time.perf_counter() - started
    return elapsed, tally, sum(outcome.rows_written for outcome in outcomes)


def report_backfill(label: str, elapsed: float, tally: Tally, rows: int, delay: float) -> None:
    floor = tally.requests * delay
    print(f"{label}: {elapsed:.1f} s, {rows} rows, {tally.requests} requests "
          f"({tally.insights} insights, {tally.refused} refused); sequential latency floor "
          f"{tally.requests} x {delay * 1000:.0f} ms = {floor:.1f} s; "
          f"wall-clock / floor {elapsed / floor:.2f}")


def wave_once(base_url: str, n_accounts: int, concurrency: int) -> tuple[float, float, int]:
    """(seconds, CPU seconds, requests) of one live wave of `n_accounts` accounts."""
    from rastro_assets.sync.types import SyncRequest
    from rastro_assets.timekeeping import local_date

    today = local_date(_world.NOW, _world.TIMEZONE)
    with _world.tempdir() as directory:
        warehouse, _ = _world.linked_warehouse(directory)
        _world.link_wave_accounts(warehouse, n_accounts)
        syncer = _world.make_syncer(warehouse, base_url)
        requests = [
            SyncRequest(_world.wave_account(index), today - timedelta(days=1), today,
                        kind="live", run_id="wave")
            for index in range(n_accounts)
        ]
        cpu = cpu_seconds()
        started = time.perf_counter()
        wave = syncer.sync_wave(requests, synced_at=_world.NOW, concurrency=concurrency)
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds() - cpu
    failed = [outcome.error for outcome in wave.outcomes if not outcome.ok]
    if failed or wave.refused or len(wave.outcomes) != n_accounts:
        raise SystemExit(f"the wave did not sync every account: {failed[:3]} {wave.refused[:3]}")
    return elapsed, cpu, sum(outcome.api_calls for outcome in wave.outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=300.0)
    parser.add_argument("--ads", type=int, default=2000)
    parser.add_argument("--wave", type=int, default=500, help="accounts in the live wave")
    parser.add_argument("--wave-concurrency", default="4,8,16",
                        help="comma-separated accounts a wave syncs at once")
    parser.add_argument("--sequential", action="store_true",
                        help="also run the backfill one range at a time (the old way)")
    parser.add_argument("--skip-backfill", action="store_true")
    parser.add_argument("--skip-wave", action="store_true")
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    lines: list[str] = []

    if not args.skip_backfill:
        blocks = _world.backfill_blocks()
        print(f"backfill: {_world.ACCOUNT}, {args.ads} ads x 90 days, row cap 5000, "
              f"{args.delay_ms:.0f} ms a request, ranges "
              f"{', '.join(f'{a}..{b}' for a, b in blocks)}")
        with _world.serve_world(args.ads, 5000, delay_ms=args.delay_ms) as server:
            report_backfill("warm-up backfill (cold fake)", *backfill_once(server.base_url,
                                                                          blocks), delay)
            elapsed, tally, rows = backfill_once(server.base_url, blocks)
            report_backfill("backfill", elapsed, tally, rows, delay)
            if args.sequential:
                report_backfill("backfill, one range at a time",
                                *backfill_once(server.base_url, blocks, range_concurrency=1),
                                delay)
        share = tally.refused / tally.insights
        lines.append(f"refused: {share:.1%} of a backfill's insights requests "
                     f"({tally.refused} of {tally.insights}) (goal <= {REFUSED_GOAL:.0%})")
        lines.append(f"backfill: {elapsed / (tally.requests * delay):.2f} of its sequential "
                     f"latency floor ({elapsed:.1f} s vs {tally.requests} x "
                     f"{args.delay_ms:.0f} ms) (goal <= {FLOOR_SHARE_GOAL:.2f})")

    if not args.skip_wave:
        widths = [int(width) for width in args.wave_concurrency.split(",")]
        print(f"live wave: {args.wave} accounts x 20 ads, {args.delay_ms:.0f} ms a request, "
              f"accounts at once: {', '.join(map(str, widths))}")
        with _world.serve_world(1, 5000, delay_ms=args.delay_ms,
                                wave_accounts=args.wave) as server:
            print(f"the fake Graph's limits: {server.limits}")
            warm, _, _ = wave_once(server.base_url, args.wave, max(widths))
            print(f"warm-up wave (cold fake, {max(widths)} at once): {warm:.1f} s")
            best = None
            for width in widths:
                elapsed, cpu, requests = wave_once(server.base_url, args.wave, width)
                whole = elapsed * WAVE_GOAL_ACCOUNTS / args.wave
                print(f"wave of {args.wave}, {width} at once: {elapsed:.1f} s "
                      f"({cpu:.1f} CPU s, {requests} requests); x {WAVE_GOAL_ACCOUNTS // args.wave}"
                      f" = {whole:.0f} s for {WAVE_GOAL_ACCOUNTS}")
                if best is None or whole < best[1]:
                    best = (width, whole, elapsed)
        width, whole, elapsed = best
        how = ("measured" if args.wave == WAVE_GOAL_ACCOUNTS else
               f"extrapolated from {args.wave} accounts in {elapsed:.1f} s")
        lines.append(f"wave: {whole / 60:.1f} min for {WAVE_GOAL_ACCOUNTS} accounts at "
                     f"{args.delay_ms:.0f} ms ({width} at once; {how}) "
                     f"(goal <= {WAVE_GOAL_SECONDS / 60:.0f} min)")

    print(f"load average {os.getloadavg()[0]:.1f} on 2 cores")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
