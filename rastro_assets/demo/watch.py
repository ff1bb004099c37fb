"""What the demo says while Dagster runs: where the UI is, once Dagster's webserver answers
there, how far the first backfills are, and "ready" once the analytics snapshot holds them."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rastro_assets.analytics.status import snapshot_backfill_counts
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.demo.terminal import say
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.warehouse.connection import Warehouse, WarehouseError, WarehouseLocked

PROGRESS_SECONDS = 20.0
# An unchanged progress line is said again only this long after it was said.
PROGRESS_REPEAT_SECONDS = 120.0
# A look at the warehouse gives way to the pipeline's writers at once: the next tick retries.
LOOK_LOCK_WAIT_SECONDS = 0.5
SAMPLE_QUERY = (
    "SELECT ad_account_id, min(day) AS first_day, max(day) AS last_day, sum(spend) AS spend"
    " FROM ad_spend_daily GROUP BY ALL ORDER BY ALL"
)


@dataclass(frozen=True)
class Progress:
    """The linked accounts' first backfills, as `rastro status` tells them."""

    accounts: int
    done: int
    days_read: int
    days_owed: int
    stuck: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.done == self.accounts

    def line(self) -> str:
        text = (
            f"backfill: {self.done} of {self.accounts} accounts done,"
            f" {self.days_read}/{self.days_owed} account-days"
        )
        return "; ".join([text, *self.stuck])


def read_progress(duckdb_path: Path, now: datetime | None = None) -> Progress | None:
    """The backfills' progress from one brief read-only look; None while writers hold the file."""
    warehouse = Warehouse(duckdb_path, lock_wait_seconds=LOOK_LOCK_WAIT_SECONDS)
    try:
        with warehouse.connect(read_only=True) as con:
            accounts = planned_accounts(con)
    except (WarehouseLocked, *WarehouseError):
        return None
    now = now or datetime.now(UTC)
    done = days_read = days_owed = 0
    stuck = []
    for account in accounts:
        status = cadence.status(account.state, now)
        if status.backfill is None:
            done += 1
            days_read += cadence.BACKFILL_DAYS
            days_owed += cadence.BACKFILL_DAYS
        else:
            days_read += status.backfill[0]
            days_owed += status.backfill[1]
        if status.state in ("error", "paused"):
            stuck.append(f"{status.ad_account_id} {status.state}: {status.last_error}")
    return Progress(len(accounts), done, days_read, days_owed, tuple(stuck))


def snapshot_ready(analytics_path: Path, accounts: int) -> bool:
    """Whether the analytics snapshot was published after every account's backfill."""
    try:
        rows = snapshot_backfill_counts(analytics_path)
    except (OSError, *WarehouseError, LookupError, ValueError):
        # Missing, being replaced, or from an older format: the next look decides.
        return False
    return rows is not None and rows[0] >= accounts and rows[1] == 0


# A look at the UI's port gives up this soon: the next tick looks again.
UI_LOOK_SECONDS = 1.0
# Straight to loopback: an HTTP proxy set in the environment never sees the look.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ui_up(port: str) -> bool:
    """Whether Dagster's webserver answers on `port`: anything else listening there (another
    dev server holding the port) is not the demo's UI."""
    try:
        url = f"http://127.0.0.1:{int(port)}/server_info"
        with _LOOPBACK.open(url, timeout=UI_LOOK_SECONDS) as answer:
            info = json.loads(answer.read(64 * 1024))
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return isinstance(info, dict) and "dagster_webserver_version" in info


class Watcher:
    """The demo's own lines while Dagster runs: the UI once it answers, the backfills'
    progress every `PROGRESS_SECONDS` until the snapshot holds them all, then "ready", never
    before the UI's address: on a restart the snapshot is ready long before the UI."""

    def __init__(
        self,
        paths: DemoPaths,
        port: str,
        analytics_path: Path,
        rastro: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths
        self.port = port
        self.analytics_path = analytics_path
        self.rastro = rastro
        self.clock = clock
        self.ui_said = False
        self.ready = False
        self.next_look = clock()
        self.last: Progress | None = None
        self.last_said = ""
        self.said_at = float("-inf")

    def tick(self) -> None:
        if not self.ui_said and ui_up(self.port):
            self.ui_said = True
            say(f"UI at http://127.0.0.1:{self.port} (Ctrl-C stops the demo)")
        if self.ready or self.clock() < self.next_look:
            return
        progress = read_progress(self.paths.duckdb)
        if progress is None:
            return  # the writers hold the file: look again next tick
        self.next_look = self.clock() + PROGRESS_SECONDS
        ready = progress.finished and snapshot_ready(self.analytics_path, progress.accounts)
        if ready and not self.ui_said:
            self.next_look = self.clock()  # "ready" follows the UI's address at once
            return
        if ready:
            self.ready = True
            if self.last is not None and not self.last.finished:
                say(progress.line())
            say(f'ready: try {self.rastro} sql "{SAMPLE_QUERY}"')
            return
        if progress.finished:
            if self.last is None or not self.last.finished:
                say(f"{progress.line()}; publishing the analytics snapshot")
        else:
            self.say_progress(progress.line())
        self.last = progress

    def say_progress(self, line: str) -> None:
        """`line`, unless it was just said: a slow backfill would otherwise repeat it every
        look, and push "ready" far down the terminal."""
        if line == self.last_said and self.clock() - self.said_at < PROGRESS_REPEAT_SECONDS:
            return
        say(line)
        self.last_said, self.said_at = line, self.clock()

