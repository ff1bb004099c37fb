"""Reading insights: sized ranges read side by side, async report jobs, the chunks they make.

A range is sized from the rows per day the account is known to hold (its history,
then each answer) so that Meta answers it; with nothing known the whole range is
asked. When Meta says a range is too much (or does not answer in time) it is split,
down to single days, and a single day that is still too much runs as an async report
job. Real Meta answers a page in a second or so: a few ranges of a read are in flight
at once, each paged one page after another.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import date, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from rastro_assets.meta.bounds import ReadBounds
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
# An insights page is read whole into one table: far more room than a page of 500 ad-days
# with their names takes, and still a bound on what one answer may cost.
INSIGHTS_PAGE_BOUNDS = ReadBounds(max_body_bytes=128 << 20)

_NODE_ID_RE = re.compile(r"^[A-Za-z0-9_-]+$")

Range = tuple[date, date]


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


META_INSIGHTS_MONTHS = 37
"""How long Meta keeps insights: a range starting before the same day this many months
before the account's local today is refused whole (#3018)."""
TARGET_ROWS_PER_RANGE = 2_000
"""Rows a range sized from an account's history aims at: four pages of 500. Meta names no
cap, so this is a guess meant to sit below it (the fake refuses above 5,000); a refusal
corrects it for the rest of the read. Pages cost the same however the days are grouped,
so small ranges cost little more than a short last page each, and a backfill's ranges are
many enough to read side by side."""
RANGE_CONCURRENCY = 4
"""Ranges of one read in flight at once; pages within a range stay one after another."""
USAGE_CEILING_PCT = 75.0
"""Above this share of the account's own limits, its ranges are read one at a time (the app's
load is paced for every account by `pacing.Pacer`)."""


class RangeSizer:
    """How many days one insights request asks for, from what is known of the account.

    Known: the most rows one day held (from the warehouse's history, then from each
    answer), and whether Meta refused a range of this read. Unrefused, a range aims at
    `target_rows`; once refused, at the most rows Meta answered in one range of this
    read (at least one day), so no later range of the read is refused. With no rate
    known, the whole range is asked (a small account reads in one request); when it is
    refused, its first day alone is read next, whose rows per day size the rest.
    """

    def __init__(self, rows_per_day: int | None = None,
                 target_rows: int = TARGET_ROWS_PER_RANGE) -> None:
        self.rows_per_day = rows_per_day if rows_per_day and rows_per_day > 0 else None
        self._target_rows = target_rows
        self._answered_rows = 0
        self._refused = False

    def learn_answer(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        busiest = pc.max(pc.value_counts(table["day"]).field("counts")).as_py()
        self.rows_per_day = max(self.rows_per_day or 0, busiest)
        self._answered_rows = max(self._answered_rows, table.num_rows)

    def learn_refusal(self) -> None:
        self._refused = True

    def days_per_range(self) -> int | None:
        """Days a request may ask for; None: nothing is known, ask the whole range."""
        if self.rows_per_day is None:
            return None
        limit = self._answered_rows if self._refused else self._target_rows
        return max(1, limit // self.rows_per_day)

    def split(self, since: date, until: date) -> list[Range]:
        days = self.days_per_range()
        if days is None:
            return [(since, until)]
        ranges = []
        start = since
        while start <= until:
            end = min(until, start + timedelta(days=days - 1))
            ranges.append((start, end))
            start = end + timedelta(days=1)
        return ranges


class _Refused(Exception):
    """Meta said a range is too much (or did not answer it in time)."""


class _Stopped(Exception):
    """Another range of the read was throttled: this one stops between pages."""


class InsightsReader:
    """Insights of one session, read `page_size` rows a page.

    Args:
        session: the Graph session every request goes through.
        page_size: `limit` asked for on each page.
        async_poll_seconds: the wait between polls of an async report job.
        async_timeout_seconds: how long to wait for an async report job.
        range_concurrency: ranges of one read in flight at once.
        range_rows: rows a range sized from a known rate aims at.
    """

    def __init__(
        self,
        session: GraphSession,
        *,
        page_size: int,
        async_poll_seconds: float,
        async_timeout_seconds: float,
        range_concurrency: int = RANGE_CONCURRENCY,
        range_rows: int = TARGET_ROWS_PER_RANGE,
    ) -> None:
        if range_concurrency < 1 or range_rows < 1:
            raise ValueError("range_concurrency and range_rows must be at least 1")
        self._range_rows = range_rows
        self._session = session
        self._page_size = page_size
        self._async_poll_seconds = async_poll_seconds
        self._async_timeout_seconds = async_timeout_seconds
        self.range_concurrency = range_concurrency

    def chunks(
        self, act: str, since: date, until: date, *, rows_per_day: int | None = None
    ) -> Iterator[InsightsChunk]:
        """Every ad-day of [since, until] of `act` (normalized), as chunks in date order.

        `rows_per_day`: the most rows a day of this account held lately, which sizes
        the ranges asked (None: unknown).
        """
        sizer = RangeSizer(rows_per_day, target_rows=self._range_rows)
        return _RangeRead(self, act, sizer).run(since, until)

    def _read_range(self, act: str, since: date, until: date,
                    stop: threading.Event) -> InsightsChunk:
        """One range's complete chunk; `_Refused` when Meta says it is too much."""
        try:
            table = self._read_insights(act, since, until, stop)
        except MetaError as exc:
            if not (exc.kind is ErrorKind.TOO_MUCH_DATA or isinstance(exc, TimedOut)):
                raise
            if since == until:
                log.info("%s %s is too much for one request (%s); running an async report",
                         act, since, exc)
                return self._read_async(act, since, stop)
            log.info("%s %s..%s is too much for one request (%s); splitting",
                     act, since, until, exc)
            raise _Refused(str(exc)) from None
        return InsightsChunk(since=since, until=until, table=table, complete=True)

    @property
    def busy(self) -> bool:
        """The account's own peak usage seen is above the ceiling: read one range at a time."""
        return self._session.stats.usage.account_pct > USAGE_CEILING_PCT

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

    def _read_insights(self, act: str, since: date, until: date,
                       stop: threading.Event) -> pa.Table:
        params = self._insights_params(since, until) | {"limit": str(self._page_size)}
        pages: list[pa.Table] = []
        what = f"GET {act}/insights {since}..{until}"
        for page in self._session.pages(f"{act}/insights", params, what=what,
                                        retry_timeouts=False,
                                        read_page=self._page_reader(since, until),
                                        bounds=INSIGHTS_PAGE_BOUNDS, account=act):
            if stop.is_set():
                raise _Stopped
            pages.append(_as_table(page, since, until))
        return _by_day_and_ad(pages)

    @staticmethod
    def _page_reader(since: date, until: date) -> PageReader:
        return lambda body: read_insights_page(body, since, until)

    def _read_async(self, act: str, day: date, stop: threading.Event) -> InsightsChunk:
        what = f"async report for {act} on {day}"
        run_id = self._start_report(act, day, what)
        if run_id is None or not self._report_finished(act, run_id, what, stop):
            return _incomplete(day)
        return self._read_report(act, run_id, day, what)

    def _start_report(self, act: str, day: date, what: str) -> str | None:
        """The started report's id; None when Meta will not start one (too much data)."""
        try:
            body = self._session.call("POST", f"{act}/insights",
                                      data=self._insights_params(day, day),
                                      what=f"POST {act}/insights {day}", account=act)
        except MetaError as exc:
            if exc.kind is not ErrorKind.TOO_MUCH_DATA:
                raise
            log.warning("%s could not start: %s", what, exc)
            return None
        run_id = body.get("report_run_id")
        if isinstance(run_id, int) and not isinstance(run_id, bool):
            run_id = str(run_id)
        if not isinstance(run_id, str) or not _NODE_ID_RE.match(run_id):
            raise MalformedResponse(f"Meta started {what} without a usable 'report_run_id'")
        return run_id

    def _report_finished(self, act: str, run_id: str, what: str,
                         stop: threading.Event) -> bool:
        """Poll the report until it is done (True), or Meta gave up or it took too long."""
        waited_seconds = 0.0
        started = time.monotonic()
        while True:
            job = self._session.call("GET", run_id, params={"fields": REPORT_FIELDS},
                                     what=f"GET report {run_id}", account=act)
            status = job.get("async_status")
            if status == ASYNC_DONE:
                return True
            if not isinstance(status, str):
                raise MalformedResponse(f"report {run_id} answered without an 'async_status'")
            if status in ASYNC_GAVE_UP:
                log.warning("%s ended %r (error %s: %s); the day stays incomplete", what,
                            status, job.get("error_code"),
                            self._session.scrub(str(job.get("error_message"))))
                return False
            elapsed = max(waited_seconds, time.monotonic() - started)
            if elapsed >= self._async_timeout_seconds:
                log.warning("%s still %r after %.0fs; the day stays incomplete",
                            what, status, elapsed)
                return False
            self._session.sleep(self._async_poll_seconds)
            waited_seconds += self._async_poll_seconds
            if stop.is_set():
                raise _Stopped

    def _read_report(self, act: str, run_id: str, day: date, what: str) -> InsightsChunk:
        pages: list[pa.Table] = []
        try:
            for page in self._session.pages(f"{run_id}/insights",
                                            {"limit": str(self._page_size)},
                                            what=f"GET report {run_id}/insights",
                                            read_page=self._page_reader(day, day),
                                            bounds=INSIGHTS_PAGE_BOUNDS, account=act):
                pages.append(_as_table(page, day, day))
        except MetaError as exc:
            if exc.kind is not ErrorKind.TOO_MUCH_DATA:
                raise
            log.warning("%s could not be read in full: %s", what, exc)
            return _incomplete(day, pages)
        return InsightsChunk(since=day, until=day, table=_by_day_and_ad(pages), complete=True)


def _as_table(page: object, since: date, until: date) -> pa.Table:
    """A page as the byte reader read it, or parsed row by row when it could not."""
    return page if isinstance(page, pa.Table) else parse_insight_table(page, since, until)


def _incomplete(day: date, pages: Sequence[pa.Table] = ()) -> InsightsChunk:
    """What was read of a day Meta would not answer in full: kept, and marked incomplete."""
    return InsightsChunk(since=day, until=day, table=_by_day_and_ad(list(pages)), complete=False)


class _RangeRead:
    """One read's ranges: sized, read up to `range_concurrency` at a time, yielded in order.

    Ranges wait in date order; a refused one is split (by the sizer once it knows a
    rate, else its first day apart) and its parts go back in their place. After the
    first failure no range starts; a throttle also stops the ranges in flight between
    pages (the account's budget is spent), while after any other failure they finish,
    so what they read is kept. What was read completely is yielded, in date order,
    before the failure is raised.
    """

    def __init__(self, reader: InsightsReader, act: str, sizer: RangeSizer) -> None:
        self._reader = reader
        self._act = act
        self._sizer = sizer
        self._stop = threading.Event()
        self._pending: list[Range] = []
        self._done: dict[date, InsightsChunk] = {}
        self._failure: BaseException | None = None

    def run(self, since: date, until: date) -> Iterator[InsightsChunk]:
        self._pending = [(since, until)]
        cursor = since
        in_flight: dict[Future[tuple[InsightsChunk | None, BaseException | None]], Range] = {}
        executor: ThreadPoolExecutor | None = None
        try:
            while True:
                while self._may_launch(cursor, len(in_flight)):
                    piece = self._take()
                    width = self._width()
                    if width == 1 or (executor is None and not self._pending and not in_flight):
                        self._settle(piece, *self._attempt(piece))
                        continue
                    if executor is None:
                        executor = ThreadPoolExecutor(
                            self._reader.range_concurrency, thread_name_prefix="rastro-range"
                        )
                    in_flight[executor.submit(self._attempt, piece)] = piece
                while cursor in self._done:
                    chunk = self._done.pop(cursor)
                    cursor = chunk.until + timedelta(days=1)
                    yield chunk
                if not in_flight:
                    if self._failure is not None or not self._pending:
                        break
                    continue
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._settle(in_flight.pop(future), *future.result())
        finally:
            self._stop.set()
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        if self._failure is not None:
            for start in sorted(self._done):
                yield self._done.pop(start)
            raise self._failure

    def _width(self) -> int:
        if self._reader.busy or self._sizer.rows_per_day is None:
            # Nothing sizes the ranges yet: side by side they would be refused together.
            return 1
        return self._reader.range_concurrency

    def _may_launch(self, cursor: date, in_flight: int) -> bool:
        if not self._pending or self._failure is not None:
            return False
        if self._pending[0][0] == cursor:
            return True  # the range every later chunk waits for
        return in_flight < self._width() and len(self._done) < 2 * self._width()

    def _take(self) -> Range:
        since, until = self._pending.pop(0)
        first, *rest = self._sizer.split(since, until)
        self._pending[0:0] = rest
        return first

    def _attempt(self, piece: Range) -> tuple[InsightsChunk | None, BaseException | None]:
        try:
            return self._reader._read_range(self._act, *piece, self._stop), None
        except Exception as exc:  # noqa: BLE001 - settled (and raised) by the reading thread
            return None, exc

    def _settle(self, piece: Range, chunk: InsightsChunk | None,
                error: BaseException | None) -> None:
        if chunk is not None:
            if chunk.complete:
                self._sizer.learn_answer(chunk.table)
            self._done[chunk.since] = chunk
        elif isinstance(error, _Refused):
            self._sizer.learn_refusal()
            self._put_back(self._smaller(piece))
        elif isinstance(error, _Stopped):
            pass
        elif self._failure is None:
            self._failure = error
            if isinstance(error, MetaError) and error.kind is ErrorKind.THROTTLED:
                self._stop.set()

    def _smaller(self, piece: Range) -> list[Range]:
        since, until = piece
        if self._sizer.rows_per_day is None:
            # One day is the least Meta can be asked for; its answer sizes the rest.
            return [(since, since), (since + timedelta(days=1), until)]
        parts = self._sizer.split(since, until)
        if len(parts) > 1:
            return parts
        middle = since + timedelta(days=(until - since).days // 2)
        return [(since, middle), (middle + timedelta(days=1), until)]

    def _put_back(self, parts: list[Range]) -> None:
        at = bisect.bisect_left(self._pending, parts[0])
        self._pending[at:at] = parts
