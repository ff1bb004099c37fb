"""A publisher process that dies by SIGKILL.

Run as `python -m rastro_assets_tests.analytics._publish_child`.

`--kill-at POINT` hooks one step of `Publisher.publish` in this process and, when the publish
reaches it, says `killing POINT ...` on stdout and sends itself SIGKILL (no `finally`, no
`atexit`, no flush runs after that):

- `refresh`: inside the staging refresh's transaction, once the spend delta is applied;
- `checkpoint`: the refresh committed, before the staging file is checkpointed;
- `copy`: half of the staging file copied to the temporary file;
- `flush`: the temporary file whole, before its fsync and rename;
- `rename`: the new snapshot renamed into place, before the directory's fsync and the
  publish state are recorded.

`--kill-at loop` publishes again and again until the parent kills it (at a moment of its
choosing), saying `start` before each publish and `published REFRESH COPY` (seconds) after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from datetime import datetime

POINTS = ("refresh", "checkpoint", "copy", "flush", "rename")


def _die(point: str, detail: object = "") -> None:
    print(f"killing {point} {detail}".strip(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _hook(point: str) -> None:
    from rastro_assets.analytics import publish, staging

    if point == "refresh":
        apply_spend = staging._apply_spend

        def dying_apply_spend(con):
            _die(point, apply_spend(con))

        staging._apply_spend = dying_apply_spend
    elif point == "checkpoint":
        refresh = staging.refresh

        def dying_refresh(*args, **kwargs):
            refresh(*args, **kwargs)
            _die(point)

        staging.refresh = dying_refresh
    elif point == "copy":

        def half_copy(source, destination):
            size = os.path.getsize(source)
            with open(source, "rb") as reader, open(destination, "wb") as writer:
                writer.write(reader.read(size // 2))
                writer.flush()
                os.fsync(writer.fileno())
            _die(point, size)

        shutil.copyfile = half_copy
    elif point == "flush":
        os.fsync = lambda descriptor: _die(point)
    elif point == "rename":
        publish._fsync_directory = lambda directory: _die(point)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--at", required=True)
    parser.add_argument("--kill-at", required=True, choices=(*POINTS, "loop"))
    args = parser.parse_args(argv)

    from rastro_assets.analytics.publish import Publisher
    from rastro_assets.timekeeping import fixed_clock
    from rastro_assets.warehouse.connection import Warehouse

    publisher = Publisher(
        Warehouse(args.db), args.target, clock=fixed_clock(datetime.fromisoformat(args.at))
    )
    if args.kill_at == "loop":
        while True:
            print("start", flush=True)
            result = publisher.publish()
            print(f"published {result.refresh_seconds:.4f} {result.copy_seconds:.4f}", flush=True)
    _hook(args.kill_at)
    result = publisher.publish()
    print(f"published {result}", flush=True)  # never reached: the hook kills us
    return 1


if __name__ == "__main__":
    sys.exit(main())
