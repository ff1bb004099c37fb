"""Reading insights: range halving, async report jobs, and the chunks they make.

The whole range is asked first; when Meta says it is too much (or does not
answer in time) the range is halved down to single days, and a single day
that is still too much runs as an async report job.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from rastro_assets.meta.errors import ErrorKind, MalformedResponse, MetaError, TimedOut
from rastro_assets.meta.insights_parse import parse_insight_table, read_insights_page
from rastro_assets.meta.models import EFFECTIVE_STATUSES, INSIGHT_SCHEMA, InsightsChunk
from rastro_assets.meta.session import GraphSession, PageReader

log = logging.getLogger(__name__)

INSIGHTS_FIELDS = (
    "ad_id,ad_name,adset_id,adset_name,campaign_id,campaign_name,spend,impressions,clicks,"
    "actions,date_start,date_stop,account_currency"
)
REPORT_FIELDS = "async_status,async_percent_completion"
ASYNC_DONE = "Job Completed"
ASYNC_GAVE_UP = frozenset({"Job Failed", "Job Skipped"})

_NODE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def _by_day_and_ad(pages: list[pa.Table]) -> pa.Table:
    """One row per ad-day (a later copy wins: pages may repeat a row), by day then ad id.

    Arrow orders strings by their UTF-8 bytes, which is code point order, as
    Python's `sorted` does.
    """
    table = pa.concat_tables(pages) if pages else INSIGHT_SCHEMA.empty_table()
    count = table.num_rows
    if count < 2:
        return table
    day, ad_id = table["day"], table["ad_id"]
    earlier_day, later_day = day.slice(0, count - 1), day.slice(1)
    in_order = pc.or_(
        pc.less(earlier_day, later_day),
        pc.and_(pc.equal(earlier_day, later_day),
                pc.less(ad_id.slice(0, count - 1), ad_id.slice(1))),
    )
    if pc.all(in_order).as_py():
        return table  # already in order, so no repeats either
    position = pa.array(range(count), pa.int64())
    latest = (
        table.select(["day", "ad_id"])
        .append_column("position", position)
        .group_by(["day", "ad_id"], use_threads=False)
        .aggregate([("position", "max")])
    )
    return table.take(latest["position_max"]).sort_by([("day", "ascending"),
                                                       ("ad_id", "ascending")])


class InsightsReader:
    """Insights of one session, read `page_size` rows a page.

    Args:
        session: the Graph session every request goes through.
        page_size: `limit` asked for on each page.
        async_poll_seconds: the wait between polls of an async report job.
        async_timeout_seconds: how long to wait for an async report job.
    """

    def __init__(
        self,
        session: GraphSession,
        *,
        page_size: int,
        async_poll_seconds: float,
        async_timeout_seconds: float,
    ) -> None:
        self._session = session
        self._page_size = page_size
        self._async_poll_seconds = async_poll_seconds
        self._async_timeout_seconds = async_timeout_seconds

    def chunks(self, act: str, since: date, until: date) -> Iterator[InsightsChunk]:
        """Every ad-day of [since, until] of `act` (normalized), as chunks in date order."""
        return self._insights_range(act, since, until)

    def _insights_range(self, act: str, since: date, until: date) -> Iterator[InsightsChunk]:
        try:
            table = self._read_insights(act, since, until)
        except MetaError as exc:
            if not (exc.kind is ErrorKind.TOO_MUCH_DATA or isinstance(exc, TimedOut)):
                raise
            reason = str(exc)
        else:
            yield InsightsChunk(since=since, until=until, table=table, complete=True)
            return
        if since == until:
            log.info("%s %s is too much for one request (%s); running an async report",
                     act, since, reason)
            yield self._read_async(act, since)
            return
        middle = since + timedelta(days=(until - since).days // 2)
        log.info("%s %s..%s is too much for one request (%s); splitting",
                 act, since, until, reason)
        yield from self._insights_range(act, since, middle)
        yield from self._insights_range(act, middle + timedelta(days=1), until)

    def _insights_params(self, since: date, until: date) -> dict[str, str]:
        return {
            "level": "ad",
            "time_increment": "1",
            "time_range": json.dumps(
                {"since": since.isoformat(), "until": until.isoformat()}, separators=(",", ":")
            ),
            "fields": INSIGHTS_FIELDS,
            "filtering": json.dumps(
                [{"field": "ad.effective_status", "operator": "IN",
                  "value": list(EFFECTIVE_STATUSES)}],
                separators=(",", ":"),
            ),
        }

    def _read_insights(self, act: str, since: date, until: date) -> pa.Table:
        params = self._insights_params(since, until) | {"limit": str(self._page_size)}
        pages: list[pa.Table] = []
        what = f"GET {act}/insights {since}..{until}"
        for page in self._session.pages(f"{act}/insights", params, what=what,
                                        retry_timeouts=False,
                                        read_page=self._page_reader(since, until)):
            pages.append(
                page if isinstance(page, pa.Table)
                else parse_insight_table(page, since, until)
            )
        return _by_day_and_ad(pages)

    @staticmethod
    def _page_reader(since: date, until: date) -> PageReader:
        return lambda body: read_insights_page(body, since, until)

    def _read_async(self, act: str, day: date) -> InsightsChunk:
        def incomplete(pages: Sequence[pa.Table] = ()) -> InsightsChunk:
            return InsightsChunk(
                since=day, until=day, table=_by_day_and_ad(list(pages)), complete=False
            )

        what = f"async report for {act} on {day}"
        try:
            body = self._session.call("POST", f"{act}/insights",
                                      data=self._insights_params(day, day),
                                      what=f"POST {act}/insights {day}")
        except MetaError as exc:
            if exc.kind is not ErrorKind.TOO_MUCH_DATA:
                raise
            log.warning("%s could not start: %s", what, exc)
            return incomplete()
        run_id = body.get("report_run_id")
        if isinstance(run_id, int) and not isinstance(run_id, bool):
            run_id = str(run_id)
        if not isinstance(run_id, str) or not _NODE_ID_RE.match(run_id):
            raise MalformedResponse(f"Meta started {what} without a usable 'report_run_id'")

        waited_seconds = 0.0
        started = time.monotonic()
        while True:
            job = self._session.call("GET", run_id, params={"fields": REPORT_FIELDS},
                                     what=f"GET report {run_id}")
            status = job.get("async_status")
            if status == ASYNC_DONE:
                break
            if not isinstance(status, str):
                raise MalformedResponse(f"report {run_id} answered without an 'async_status'")
            if status in ASYNC_GAVE_UP:
                log.warning("%s ended %r (error %s: %s); the day stays incomplete", what,
                            status, job.get("error_code"),
                            self._session.scrub(str(job.get("error_message"))))
                return incomplete()
            elapsed = max(waited_seconds, time.monotonic() - started)
            if elapsed >= self._async_timeout_seconds:
                log.warning("%s still %r after %.0fs; the day stays incomplete",
                            what, status, elapsed)
                return incomplete()
            self._session.sleep(self._async_poll_seconds)
            waited_seconds += self._async_poll_seconds

        pages: list[pa.Table] = []
        try:
            for page in self._session.pages(f"{run_id}/insights",
                                            {"limit": str(self._page_size)},
                                            what=f"GET report {run_id}/insights",
                                            read_page=self._page_reader(day, day)):
                pages.append(
                    page if isinstance(page, pa.Table)
                    else parse_insight_table(page, day, day)
                )
        except MetaError as exc:
            if exc.kind is not ErrorKind.TOO_MUCH_DATA:
                raise
            log.warning("%s could not be read in full: %s", what, exc)
            return incomplete(pages)
        return InsightsChunk(since=day, until=day, table=_by_day_and_ad(pages), complete=True)
