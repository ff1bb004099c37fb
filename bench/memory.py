"""Peak memory of a 90-day backfill of one account with 5,000 ads through the sync core.

A child process runs the backfill (`Syncer.sync` over the three 30-day ranges of the Dagster
backfill, into a fresh warehouse) against the fake Graph served from a third process on
loopback, and reports its own peak RSS (`VmHWM` in /proc/self/status; `ru_maxrss` as a
cross-check). The fake's memory is not counted. Every ad delivers every day: 450,000 ad-days.

By default the fake keeps its row_cap (5,000 rows a request): with 5,000 ads a day is the most
one request may ask, so the client reads day by day and each chunk holds one day. With
`--row-cap 1000000` nothing is split: each 30-day range is one request of 150,000 rows, read
whole before it is written (a chunk is complete, and may delete, only once every page is
read): the worst case. The last line reports the default.

Run: .venv/bin/python bench/memory.py [--row-cap N] [--ads 5000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

GOAL_MB = 400


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(ads: int, row_cap: int) -> None:
    """Run the backfill in this process and print a JSON line with its figures."""
    import rastro_assets.sync.syncer  # noqa: F401  (imports counted in the baseline)

    baseline_kb = _status_kb("VmRSS")
    with _world.serve_world(ads, row_cap) as server, _world.tempdir() as directory:
        warehouse, _ = _world.linked_warehouse(directory)
        syncer = _world.make_syncer(warehouse, server.base_url)
        started = time.perf_counter()
        outcomes = _world.run_backfill(syncer, _world.backfill_blocks())
        elapsed = time.perf_counter() - started
    print(json.dumps({
        "rows": sum(outcome.rows_written for outcome in outcomes),
        "calls": sum(outcome.api_calls for outcome in outcomes),
        "seconds": round(elapsed, 1),
        "baseline_mb": baseline_kb / 1024,
        "peak_mb": _status_kb("VmHWM") / 1024,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }), flush=True)


def measure(ads: int, row_cap: int) -> dict:
    output = subprocess.run(
        [sys.executable, __file__, "--child", "--ads", str(ads), "--row-cap", str(row_cap)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ads", type=int, default=5000)
    parser.add_argument("--row-cap", type=int, default=5000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.ads, args.row_cap)
        return
    figures = measure(args.ads, args.row_cap)
    print(f"{args.ads} ads x 90 days, row_cap {args.row_cap}: {figures['rows']} rows, "
          f"{figures['calls']} calls, {figures['seconds']} s")
    print(f"RSS after imports {figures['baseline_mb']:.0f} MB; peak {figures['peak_mb']:.0f} MB "
          f"(ru_maxrss {figures['maxrss_mb']:.0f} MB)")
    print(f"memory: {figures['peak_mb']:.0f} MB (goal <= {GOAL_MB} MB)")


if __name__ == "__main__":
    main()
