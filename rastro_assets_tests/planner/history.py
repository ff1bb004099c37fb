"""Sync histories written the way syncs write them, for the planner's and retention's tests."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pyarrow as pa

from rastro_assets.planner import cadence
from rastro_assets.timekeeping import local_date

LIVE = timedelta(minutes=45)

COLUMNS = [
    ("run_id", pa.string()),
    ("ad_account_id", pa.string()),
    ("kind", pa.string()),
    ("since", pa.date32()),
    ("until", pa.date32()),
    ("started_at", pa.timestamp("us", tz="UTC")),
    ("finished_at", pa.timestamp("us", tz="UTC")),
    ("outcome", pa.string()),
    ("error", pa.string()),
    ("catalog", pa.bool_()),
    ("usage_pct", pa.float64()),
    ("regain_at", pa.timestamp("us", tz="UTC")),
    ("incomplete_days", pa.string()),
]


class History:
    """One account's runs, written the way syncs write them."""

    def __init__(self, account: str, timezone: str, linked_at: datetime) -> None:
        self.account, self.timezone, self.linked_at = account, timezone, linked_at
        self.rows: list[dict] = []

    def run(self, kind, since, until, at, outcome="ok", *, catalog=False, took=timedelta(
            seconds=40), error=None, usage=None, regain_at=None, incomplete=()):
        unfinished = outcome is None
        self.rows.append({
            "run_id": f"{kind}-{len(self.rows)}", "ad_account_id": self.account, "kind": kind,
            "since": since, "until": until, "started_at": at,
            "finished_at": None if unfinished else at + took, "outcome": outcome,
            "error": error or (None if outcome in ("ok", None) else f"META_UNAVAILABLE: {kind}"),
            "catalog": catalog, "usage_pct": usage, "regain_at": regain_at,
            "incomplete_days": ",".join(day.isoformat() for day in incomplete) or None,
        })

    def today(self, at: datetime):
        return local_date(at, self.timezone)

    def backfill(self, at: datetime, incomplete=()):
        link_day = self.today(self.linked_at)
        for block, (since, until) in enumerate(
            cadence.split_blocks(link_day - timedelta(days=89), link_day)
        ):
            self.run("backfill", since, until, at + timedelta(minutes=block),
                     incomplete=[day for day in incomplete if since <= day <= until])

    def cadence(self, start: datetime, end: datetime, *, fail_every: int = 0,
                rng: random.Random | None = None):
        """Live syncs every 45 minutes and the 04:00 re-sync, from `start` to `end`."""
        at, count, last_daily = start, 0, None
        while at < end:
            today = self.today(at)
            slot = cadence.daily_slot(today, self.timezone)
            if at >= slot and last_daily != today:
                weekly = today.toordinal() % 7 == 0
                days = 28 if weekly else 7
                self.run("weekly" if weekly else "daily", today - timedelta(days=days - 1),
                         today, at, catalog=True, took=timedelta(minutes=2))
                last_daily = today
            else:
                count += 1
                failed = fail_every and count % fail_every == 0
                if rng is not None:
                    failed = rng.random() < 0.05
                self.run("live", today - timedelta(days=1), today, at,
                         "other" if failed else "ok", usage=rng.random() * 90 if rng else 10.0)
            at += LIVE
