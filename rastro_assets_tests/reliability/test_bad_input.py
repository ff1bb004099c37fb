"""Bad input, generated: Meta pages and command lines that try to break the warehouse.

A generated insights answer (several pages, served through the real client by
an `httpx.MockTransport`) either lands exactly — every figure equal as a
Decimal, every name as sent — or is refused with a clear, short error, and a
refused answer writes nothing. Command-line input is likewise accepted as
given (normalized) or refused with exit 2, one line on stderr, nothing written.
Every case runs on both engines (the generated ones with fewer examples on PostgreSQL).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rastro_assets import cli
from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.models import InsightRow, InsightsChunk, insight_table
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.spend_schema import SPEND_TYPE
from rastro_assets.sync.syncer import Syncer
from rastro_assets.sync.types import SyncRequest
from rastro_assets.timekeeping import days_between
from rastro_assets.vault import ENV_VAR, Vault, generate_key
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.ad_spend_table import write_spend
from rastro_assets.warehouse.connection import Warehouse, transaction
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.insight_rows import chunk_from_rows
from rastro_assets_tests.reliability.helpers import (
    open_warehouse_of,
    table_dump,
    warehouse_env_for,
)
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact

ACCOUNT = "act_101"
SINCE, UNTIL = date(2026, 11, 27), date(2026, 11, 29)  # before Sao Paulo's today at NOW
DAYS = [d.isoformat() for d in days_between(SINCE, UNTIL)]
ADS = ("1001", "1002", "1003", "1004")
MESSAGING = "onsite_conversion.messaging_conversation_started_7d"
GRAPH = "https://graph.facebook.com/v25.0"
# What the warehouse holds before each example: every day has rows a
# complete read would replace or delete, so a refused answer that wrote
# anything would show.
BASELINE = [
    InsightRow(ad, day, Decimal("9.9900"), 100, 5, 1, ad_name=f"old {ad}")
    for day in days_between(SINCE, UNTIL)
    for ad in ADS[:3]
]
pytestmark = pytest.mark.engines("duckdb", "postgres")
PROPERTY_SETTINGS = settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# The generated tests run again on PostgreSQL with fewer examples: an example runs the
# same statements on either engine, and what an engine may take differently (a NUL, a
# digit too many) is generated often enough to show in 25.
POSTGRES_PROPERTY_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=25)
duckdb_only, postgres_only = pytest.mark.engines("duckdb"), pytest.mark.engines("postgres")


# -- generated answers ---------------------------------------------------------------

# Each fault a row may carry: (name, what a correct system does with it).
#   refuse: the whole answer is refused; accept: stored as the model says;
#   either: stored as the model says, or refused.
REFUSE, ACCEPT, EITHER = "refuse", "accept", "either"


@dataclass
class Row:
    ad_id: str
    day: str
    spend: Any  # str, or a Num (a JSON number literal), or anything wrong
    impressions: Any
    clicks: Any
    conversations: Any
    names: dict[str, Any]
    verdict: str = ACCEPT
    keywords: tuple[str, ...] = ()  # a refusal's message names one of these
    drop: tuple[str, ...] = ()
    stop: str | None = None  # date_stop, when not the row's day

    def json_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ad_id": self.ad_id,
            "date_start": self.day,
            "date_stop": self.stop or self.day,
            "spend": self.spend,
            "impressions": self.impressions,
            "clicks": self.clicks,
            "account_currency": "BRL",
            **self.names,
        }
        if self.conversations is not None:
            out["actions"] = [
                {"action_type": "link_click", "value": "3"},
                {"action_type": MESSAGING, "value": self.conversations},
            ]
        for key in self.drop:
            out.pop(key, None)
        return out


@dataclass(frozen=True)
class Num:
    """A JSON number literal written as is (json.dumps has no way to)."""

    text: str


def dumps(value: Any) -> str:
    marks: dict[str, str] = {}

    def default(obj: Any) -> Any:
        if isinstance(obj, Num):
            mark = f"@@num{len(marks)}@@"
            marks[mark] = obj.text
            return mark
        raise TypeError(type(obj))

    text = json.dumps(value, default=default, ensure_ascii=False)
    for mark, literal in marks.items():
        text = text.replace(f'"{mark}"', literal)
    return text


# The faults: name -> (verdict, keywords, how it changes a row).
def _set(**changes):
    def apply(row: Row) -> None:
        for key, value in changes.items():
            setattr(row, key, value)

    return apply


def _drop(*keys):
    def apply(row: Row) -> None:
        row.drop = row.drop + keys

    return apply


def _day(offset: int):
    def apply(row: Row) -> None:
        row.day = (date.fromisoformat(row.day) + timedelta(days=offset)).isoformat()

    return apply


def _span(row: Row) -> None:
    row.stop = (date.fromisoformat(row.day) + timedelta(days=1)).isoformat()


FAULTS = {
    "no_spend": (REFUSE, ("spend",), _drop("spend")),
    "no_ad_id": (REFUSE, ("ad_id",), _drop("ad_id")),
    "no_date": (REFUSE, ("date_start",), _drop("date_start")),
    "no_impressions": (ACCEPT, (), _drop("impressions")),
    "no_clicks": (ACCEPT, (), _drop("clicks")),
    "no_names": (ACCEPT, (), _drop("ad_name", "adset_name", "campaign_name")),
    "spend_number": (ACCEPT, (), lambda row: setattr(row, "spend", Num(str(row.spend)))),
    "spend_integer": (ACCEPT, (), _set(spend=Num("42"))),
    "spend_true": (REFUSE, ("spend",), _set(spend=True)),
    "spend_null": (REFUSE, ("spend",), _set(spend=None)),
    "spend_list": (REFUSE, ("spend",), _set(spend=["1"])),
    "spend_text": (REFUSE, ("spend",), _set(spend="twelve")),
    "spend_nan": (REFUSE, ("spend",), _set(spend="NaN")),
    "spend_inf": (REFUSE, ("spend",), _set(spend="Infinity")),
    "spend_empty": (REFUSE, ("spend",), _set(spend="")),
    "spend_negative": (EITHER, ("spend",), _set(spend="-12.3400")),
    "spend_huge": (REFUSE, ("spend", "DECIMAL"), _set(spend="123456789012345.5")),
    "spend_huge_number": (REFUSE, ("spend", "DECIMAL"), _set(spend=Num("1E+30"))),
    "spend_largest": (ACCEPT, (), _set(spend="99999999999999.9999")),
    "spend_five_places": (REFUSE, ("spend", "decimal"), _set(spend="1.23456")),
    "spend_tiny": (REFUSE, ("spend", "decimal"), _set(spend="1E-7")),
    "spend_trailing_zeros": (ACCEPT, (), _set(spend="7.1200000")),
    "spend_exponent": (ACCEPT, (), _set(spend="1.5E+2")),
    "count_fraction": (REFUSE, ("impressions",), _set(impressions="1.5")),
    "count_negative": (REFUSE, ("impressions",), _set(impressions="-1")),
    "count_text": (REFUSE, ("clicks",), _set(clicks="many")),
    "count_bool": (REFUSE, ("clicks",), _set(clicks=True)),
    "count_huge": (REFUSE, ("impressions",), _set(impressions="99999999999999999999")),
    "count_over_int64": (REFUSE, ("impressions", "64-bit"),
                         _set(impressions="9223372036854775808")),
    "count_largest": (ACCEPT, (), _set(impressions="9223372036854775807")),
    "count_number": (ACCEPT, (), _set(clicks=Num("17"))),
    "count_integral_float": (EITHER, ("clicks",), _set(clicks="7.0")),
    "conversations_negative": (REFUSE, ("messaging",), _set(conversations="-2")),
    "day_after": (REFUSE, ("outside",), _day(+3)),
    "day_before": (REFUSE, ("outside",), _day(-3)),
    "day_span": (REFUSE, ("one day", "spans"), _span),
    "day_garbage": (REFUSE, ("date_start",), _set(day="2026-13-45")),
    # A valid JSON escape, but no character: stored as U+FFFD.
    "lone_surrogate_name": (ACCEPT, (), lambda row: row.names.update(ad_name="Promo \ud83d fim")),
    # A character too, but not one PostgreSQL's text can hold: stored as U+FFFD on both.
    "nul_name": (ACCEPT, (), lambda row: row.names.update(ad_name="Promo \x00 fim")),
}


def model(row: Row) -> tuple:
    """(spend, impressions, clicks, conversations) as a correct system stores them."""

    def number(value: Any) -> Decimal:
        return Decimal(value.text if isinstance(value, Num) else value)

    def count(key: str, value: Any) -> int:
        return 0 if key in row.drop or value is None else int(number(value))

    return (
        number(row.spend),
        count("impressions", row.impressions),
        count("clicks", row.clicks),
        count("actions", row.conversations),
    )


names_text = st.text(max_size=12)  # any Unicode (no lone surrogates): accents, emoji, CJK, NUL


@st.composite
def rows(draw, ad_id: str | None = None, day: str | None = None) -> Row:
    """A good row (of `ad_id` on `day` when given), one time in four with a fault."""
    row = Row(
        ad_id=ad_id or draw(st.sampled_from(ADS)),
        day=day or draw(st.sampled_from(DAYS)),
        spend=str(draw(st.decimals(min_value=0, max_value=10**6, places=draw(
            st.integers(0, 4)), allow_nan=False, allow_infinity=False))),
        impressions=str(draw(st.integers(0, 10**9))),
        clicks=str(draw(st.integers(0, 10**6))),
        conversations=draw(st.one_of(st.none(), st.integers(0, 500).map(str))),
        names={
            "ad_name": draw(names_text),
            "adset_name": draw(names_text),
            "campaign_name": draw(names_text),
        },
    )
    if draw(st.integers(0, 3)) == 0:
        with_fault(row, draw(st.sampled_from(sorted(FAULTS))))
    return row


def with_fault(row: Row, fault: str) -> Row:
    verdict, keywords, apply = FAULTS[fault]
    apply(row)
    row.verdict, row.keywords = verdict, keywords
    return row


@st.composite
def answers(draw) -> list[list[Row]]:
    """An insights answer: 1-4 pages of rows; sometimes a row repeats an earlier ad-day."""
    flat = draw(st.lists(rows(), min_size=0, max_size=10))
    if flat and draw(st.booleans()):
        original = draw(st.sampled_from(flat))
        repeat = draw(rows(original.ad_id, original.day))
        flat.insert(draw(st.integers(flat.index(original) + 1, len(flat))), repeat)
    cuts = sorted(draw(st.lists(st.integers(0, len(flat)), max_size=3)))
    pages, start = [], 0
    for cut in [*cuts, len(flat)]:
        pages.append(flat[start:cut])
        start = cut
    return pages


class Pages:
    """An httpx.MockTransport handler answering one insights query with `pages`."""

    def __init__(self, pages: list[list[Row]]) -> None:
        self.bodies = []
        for index, page in enumerate(pages):
            body: dict[str, Any] = {"data": [row.json_object() for row in page]}
            if index + 1 < len(pages):
                body["paging"] = {
                    "cursors": {"before": f"c{index}", "after": f"c{index + 1}"},
                    "next": f"{GRAPH}/{ACCOUNT}/insights?after=c{index + 1}",
                }
            # A lone surrogate travels as its JSON escape, as Meta would write it.
            text = re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m[0]):04x}", dumps(body))
            self.bodies.append(text.encode())
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        after = parse_qs(urlsplit(str(request.url)).query).get("after", ["c0"])[0]
        body = self.bodies[int(after.removeprefix("c"))]
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})


# -- the warehouse the answers go to ----------------------------------------------------


@dataclass
class Bench:
    warehouse: Warehouse | PostgresWarehouse
    vault: Vault


class Benches:
    """One linked warehouse an engine for the module, made when first asked for (a DuckDB
    file held open until the module ends); every answer starts from `reset`."""

    def __init__(self, tmp_path_factory, request: pytest.FixtureRequest) -> None:
        self.tmp_path_factory, self.request = tmp_path_factory, request
        self.made: dict[str, Bench] = {}
        self.held = contextlib.ExitStack()

    def __call__(self, engine: str) -> Bench:
        if engine not in self.made:
            vault = Vault.from_env({ENV_VAR: generate_key()})
            path = self.tmp_path_factory.mktemp("bench") / "rastro.duckdb"
            server = None
            if engine == "postgres":
                server = self.request.getfixturevalue("warehouse_server")
            warehouse = open_warehouse_of(warehouse_env_for(engine, path, server),
                                          lock_wait_seconds=5)
            warehouse.migrate()
            with warehouse.connect() as con:
                site_store.add_site(con, "s1", "Site one", NOW)
                site_store.add_site(con, "s2", "Site two", NOW)
                registry.save_connection(con, "c1", vault.seal("c1", TOKEN), NOW)
                link_store.link_account(con, "s1", ACCOUNT, "c1", "America/Sao_Paulo", "BRL", NOW)
                link_store.link_account(con, "s2", ACCOUNT, "c1", "America/Sao_Paulo", "BRL", NOW)
            self.held.enter_context(warehouse.held())
            self.made[engine] = Bench(warehouse, vault)
        return self.made[engine]

    def close(self) -> None:
        self.held.close()
        for bench in self.made.values():
            if bench.warehouse.engine == "postgres":
                bench.warehouse.close()


@pytest.fixture(scope="module")
def benches(tmp_path_factory, request) -> Iterator[Benches]:
    made = Benches(tmp_path_factory, request)
    yield made
    made.close()


@pytest.fixture
def bench(engine: str, benches: Benches) -> Bench:
    return benches(engine)


def reset(warehouse: Warehouse) -> dict[str, list[tuple]]:
    with warehouse.connect() as con, transaction(con):
        for table in ("ad_spend_daily", "site_spend_daily", "ad_catalog", "meta_sync_runs"):
            con.execute(f"DELETE FROM {table}")
        write_spend(con, ACCOUNT, days=list(days_between(SINCE, UNTIL)),
                    rows=insight_table(BASELINE),
                    complete_days=list(days_between(SINCE, UNTIL)), synced_at=NOW)
    return snapshot(warehouse)


def snapshot(warehouse: Warehouse) -> dict[str, list[tuple]]:
    with warehouse.connect() as con:
        return {
            table: table_dump(con, table)
            for table in ("ad_spend_daily", "site_spend_daily", "ad_catalog")
        }


def syncer_for(bench: Bench, handler) -> Syncer:
    def client(token: str) -> MetaClient:
        return MetaClient(token, base_url=GRAPH, transport=httpx.MockTransport(handler),
                          sleep=lambda seconds: None, page_size=3)

    return Syncer(bench.warehouse, client, vault_factory=lambda: bench.vault,
                  clock=lambda: NOW)


def expected_rows(pages: list[list[Row]]) -> dict[tuple, tuple]:
    latest: dict[tuple, Row] = {}
    for page in pages:
        for row in page:
            latest[(row.ad_id, date.fromisoformat(row.day))] = row
    return {key: model(row) for key, row in latest.items()}


def expected_names(pages: list[list[Row]]) -> dict[str, str]:
    """The catalog name of each ad: the latest day's non-empty name, as sent."""
    latest: dict[tuple, Row] = {}
    for page in pages:
        for row in page:
            latest[(row.ad_id, row.day)] = row
    names: dict[str, tuple[str, str]] = {}
    for (ad_id, day), row in latest.items():
        name = None if "ad_name" in row.drop else row.names.get("ad_name")
        if isinstance(name, str) and name and (ad_id not in names or day > names[ad_id][0]):
            names[ad_id] = (day, name.replace("\ud83d", "\ufffd").replace("\x00", "\ufffd"))
    return {ad_id: name for ad_id, (_, name) in names.items()}


@duckdb_only
@PROPERTY_SETTINGS
@given(pages=answers())
def test_a_generated_answer_is_stored_exactly_or_refused_whole(bench, pages):
    check_answer(bench, pages, overflows=overflows_when_summed(pages))


@postgres_only
@POSTGRES_PROPERTY_SETTINGS
@given(pages=answers())
def test_a_generated_answer_is_stored_exactly_or_refused_whole_on_postgres(bench, pages):
    check_answer(bench, pages, overflows=overflows_when_summed(pages))


def overflows_when_summed(pages: list[list[Row]]) -> bool:
    if any(row.verdict == REFUSE for page in pages for row in page):
        return False  # refused at parse, before any sum
    sums: Counter[tuple[date, int]] = Counter()
    for (_, day), figures in expected_rows(pages).items():
        for index, value in enumerate(figures):
            sums[(day, index)] += value
    spend_limit = Decimal("99999999999999.9999")  # DECIMAL(18,4)
    ranges = [(-spend_limit, spend_limit)] + [(-(2**63), 2**63 - 1)] * 3  # then BIGINTs
    return any(
        not ranges[index][0] <= total <= ranges[index][1] for (_, index), total in sums.items()
    )


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_alone(bench, fault):
    """Every fault at least once, next to a good row, on the second of two pages."""

    def row(ad_id: str, day: str) -> Row:
        return Row(ad_id, day, "12.3400", "1000", "40", "3",
                   {"ad_name": f"Ação ☀️ {ad_id}", "adset_name": "Conjunto", "campaign_name": "Ç"})

    check_answer(bench, [[row("1001", DAYS[0])], [with_fault(row("1002", DAYS[1]), fault)]])


def check_answer(bench: Bench, pages: list[list[Row]], *, overflows: bool = False) -> None:
    """`overflows`: every row fits, but a day's sum does not fit `site_spend_daily`."""
    before = reset(bench.warehouse)
    verdicts = {row.verdict for page in pages for row in page}
    if overflows:
        verdicts.add(REFUSE)
    outcome = syncer_for(bench, Pages(pages)).sync(
        SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="generated")
    )
    error = outcome.error

    stored_ok = outcome is not None and outcome.ok
    if REFUSE in verdicts:
        assert not stored_ok, "an answer with a broken row was stored"
    elif EITHER not in verdicts:
        assert stored_ok, f"a good answer was refused: {error}"

    if stored_ok:
        assert error is None
        with bench.warehouse.connect() as con:
            stored = {
                (ad, day): (spend, impressions, clicks, conversations)
                for ad, day, spend, impressions, clicks, conversations in con.execute(
                    "SELECT ad_id, day, spend, impressions, clicks, conversations"
                    " FROM ad_spend_daily WHERE ad_account_id = ?", [ACCOUNT]
                ).fetchall()
            }
            names = dict(con.execute("SELECT ad_id, ad_name FROM ad_catalog").fetchall())
            assert_site_spend_exact(con)
        want = expected_rows(pages)
        assert stored.keys() == want.keys()
        for key, figures in want.items():
            got = stored[key]
            assert isinstance(got[0], Decimal) and got[0] == figures[0], (key, got, figures)
            assert got[1:] == figures[1:], (key, got, figures)
        want_names = expected_names(pages)
        assert {ad: names.get(ad) for ad in want_names} == want_names
    else:
        assert error, "a refusal says why"
        assert len(error) <= 300 and "\n" not in error, error
        assert "unexpected" not in error, f"bad data must be named, not 'unexpected': {error}"
        keywords = {word for page in pages for row in page if row.verdict == REFUSE
                    for word in row.keywords}
        if keywords:
            assert any(word.lower() in error.lower() for word in keywords), (keywords, error)
        assert snapshot(bench.warehouse) == before, "a refused answer wrote something"
        assert outcome.error.startswith("META_UNAVAILABLE: "), outcome.error
        with bench.warehouse.connect() as con:
            [run] = runs_by_account(sync_run_rows(con))[ACCOUNT]
        assert (run.outcome, run.error) == ("other", outcome.error)


def test_every_fault_is_a_generated_one():
    assert {verdict for verdict, _, _ in FAULTS.values()} == {REFUSE, ACCEPT, EITHER}


def test_a_writer_refusal_finishes_the_run_with_a_classified_outcome(bench):
    """A client that hands the writer a spend DECIMAL(18,4) cannot hold. parse.py refuses
    such pages, and `insight_table` such rows, so this is defense in depth: an
    Arrow array built without checks may hold more digits than its type says, and the
    writer's reason must reach the run."""
    reset(bench.warehouse)

    class Client:
        stats = MetaClient("x", base_url=GRAPH).stats

        def insights(self, ad_account_id, since, until, *, rows_per_day=None):
            row = InsightRow("1001", SINCE, Decimal(1), 1, 1, 0)
            table = chunk_from_rows(since, until, [row], complete=True).table
            spend = pa.array([Decimal("100000000000000")], pa.decimal128(38, 4))
            unchecked = spend.cast(SPEND_TYPE, safe=False)
            yield InsightsChunk(since, until, table.set_column(2, "spend", unchecked), True)

        def close(self):
            pass

    syncer = Syncer(bench.warehouse, lambda token: Client(), vault_factory=lambda: bench.vault,
                    clock=lambda: NOW)
    outcome = syncer.sync(SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="refused"))
    assert outcome.outcome == "other"
    assert "decimal" in outcome.error.lower() and "1001" in outcome.error, outcome.error


@pytest.mark.parametrize(
    ("spend", "impressions", "figure"),
    [("1.00", "9223372036854775807", "impressions"), ("99999999999999.9999", "1", "spend")],
)
def test_a_day_whose_figures_overflow_when_summed_is_refused_clearly(
    bench, spend, impressions, figure
):
    before = reset(bench.warehouse)
    names = {"ad_name": "x", "adset_name": "y", "campaign_name": "z"}
    page = [Row(ad, DAYS[0], spend, impressions, "1", None, dict(names)) for ad in ADS[:2]]
    outcome = syncer_for(bench, Pages([page])).sync(
        SyncRequest(ACCOUNT, SINCE, UNTIL, run_id="overflow")
    )
    assert outcome.outcome == "other"
    assert snapshot(bench.warehouse) == before
    assert figure in outcome.error and "unexpected" not in outcome.error, outcome.error


# -- command lines --------------------------------------------------------------------

ACCOUNT_IDS = st.one_of(
    st.from_regex(r"(act_)?[0-9]{1,15}", fullmatch=True),
    st.sampled_from(["act_", "act_12a", "ACT_12", "act__1", "act_-1", "12 34", "act_1|2026-11-30",
                     "act_١٢٣", "١٢٣", "act_1\n", "-1", "--connection", "-h",
                     "act_1;DROP TABLE sites",
                     " act_7 ", "", "act_²"]),
    st.text(max_size=12),
)
TIMEZONES = st.one_of(
    st.sampled_from(["UTC", "America/Sao_Paulo", "Asia/Tokyo", "Pacific/Chatham",
                     " Europe/Berlin "]),
    st.sampled_from(["Mars/Base", "america/sao_paulo", "../../etc/passwd", "/etc/localtime",
                     "UTC\x00", "", "  ", "Etc/GMT+99", "Europe/", "-03:00", "GMT-3"]),
    st.text(max_size=12),
)
CURRENCIES = st.one_of(
    st.sampled_from(["BRL", "usd", " JPY ", "EUR"]),
    st.sampled_from(["", "US", "DOLLARS", "U$D", "€", "R$", "BR1", "ÉUR", "usd\n"]),
    st.text(max_size=5),
)
SITE_IDS = st.one_of(
    st.sampled_from(["s1", "shop.example:br@1", "S-2_x"]),
    st.sampled_from(["", " ", "-s", "-h", "--hel", "_s", "s 1", "s/1", "loja-ção", "s" * 129,
                     "s1\n", "s1;--"]),
    st.text(max_size=10),
)


def is_account(text: str) -> bool:
    import re

    return re.fullmatch(r"(?:act_)?[0-9]+", text.strip()) is not None


def is_timezone(text: str) -> bool:
    import zoneinfo

    return text.strip() in zoneinfo.available_timezones()


def is_currency(text: str) -> bool:
    import re

    return re.fullmatch(r"[A-Z]{3}", text.strip().upper()) is not None


def is_identifier(text: str) -> bool:
    import re

    stripped = text.strip()
    pattern = r"[A-Za-z0-9][A-Za-z0-9_.:@-]*"
    return len(stripped) <= 128 and re.fullmatch(pattern, stripped) is not None


@pytest.fixture
def shell(warehouse_env, monkeypatch, capsys):
    """`rastro ARGS` in-process on a warehouse with site s1 and connection c1.

    The commands get one held warehouse (on DuckDB, cursors of one open file)
    instead of opening it several times an example; what they validate and
    write is the same.
    """
    for name, value in warehouse_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(ENV_VAR, generate_key())
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("RASTRO_META_FAKE", raising=False)
    monkeypatch.setenv("RASTRO_META_GRAPH_URL", "http://127.0.0.1:9/v25.0")  # never reached
    warehouse = open_warehouse_of(warehouse_env)

    def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    with warehouse.held():
        monkeypatch.setattr(cli.Context, "warehouse", lambda self: warehouse)
        assert run("site", "add", "s1")[0] == 0
        assert run("connect", "c1", "--no-verify", stdin=TOKEN)[0] == 0
        run.warehouse = warehouse
        yield run
    if warehouse.engine == "postgres":
        warehouse.close()


def cli_snapshot(warehouse: Warehouse) -> dict[str, list[tuple]]:
    with warehouse.connect() as con:
        return {
            table: table_dump(con, table)
            for table in ("sites", "meta_connections", "meta_ad_accounts", "site_ad_accounts",
                          "ad_spend_daily", "site_spend_daily", "meta_sync_runs")
        }


def assert_refused(result: tuple[int, str, str]) -> None:
    code, out, err = result
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rastro: error: "), err
    assert TOKEN not in out + err


@duckdb_only
@PROPERTY_SETTINGS
@given(site=SITE_IDS, account=ACCOUNT_IDS, timezone=TIMEZONES, currency=CURRENCIES)
def test_link_input_is_taken_as_given_or_refused(shell, site, account, timezone, currency):
    check_link(shell, site, account, timezone, currency)


@postgres_only
@POSTGRES_PROPERTY_SETTINGS
@given(site=SITE_IDS, account=ACCOUNT_IDS, timezone=TIMEZONES, currency=CURRENCIES)
def test_link_input_is_taken_as_given_or_refused_on_postgres(
    shell, site, account, timezone, currency
):
    check_link(shell, site, account, timezone, currency)


def printed_help(result: tuple[int, str, str], *words: str) -> bool:
    """Whether the command printed its usage because a generated word is the parser's help
    option (`-h`, `--help`, a prefix argparse expands, `-h` run together with other flags):
    a person typing it asks for help, and gets it, with nothing written."""
    code, out, _ = result
    return (code == 0 and out.startswith("usage: ")
            and any(word.startswith(("-h", "--h")) for word in words))


def check_link(shell, site, account, timezone, currency) -> None:
    before = cli_snapshot(shell.warehouse)
    result = shell("link", site, account, "--connection", "c1", "--timezone", timezone,
                   "--currency", currency)
    if printed_help(result, site, account):
        assert cli_snapshot(shell.warehouse) == before
        return
    valid = (site.strip() == "s1" and is_account(account) and is_timezone(timezone)
             and is_currency(currency))
    if result[0] == 0:
        assert valid, (site, account, timezone, currency, result)
        normalized = f"act_{account.strip().removeprefix('act_')}"
        with shell.warehouse.connect() as con:
            stored = con.execute(
                "SELECT timezone, currency FROM meta_ad_accounts WHERE ad_account_id = ?",
                [normalized],
            ).fetchall()
            assert stored == [(timezone.strip(), currency.strip().upper())]
            link_store.unlink_account(con, "s1", normalized)  # back to the snapshot
        assert cli_snapshot(shell.warehouse) == before
    else:
        assert not valid, (site, account, timezone, currency, result)
        assert_refused(result)
        assert cli_snapshot(shell.warehouse) == before


@duckdb_only
@PROPERTY_SETTINGS
@given(site=SITE_IDS)
def test_site_ids_are_taken_as_given_or_refused(shell, site):
    check_site_id(shell, site)


@postgres_only
@POSTGRES_PROPERTY_SETTINGS
@given(site=SITE_IDS)
def test_site_ids_are_taken_as_given_or_refused_on_postgres(shell, site):
    check_site_id(shell, site)


def check_site_id(shell, site) -> None:
    before = cli_snapshot(shell.warehouse)
    result = shell("site", "add", site, "--name", "Loja ☀️")
    if printed_help(result, site):
        assert cli_snapshot(shell.warehouse) == before
    elif is_identifier(site) and not site.startswith("-"):
        assert result[0] == 0, result
        with shell.warehouse.connect() as con:
            assert con.execute("SELECT name FROM sites WHERE site_id = ?",
                               [site.strip()]).fetchall() == [("Loja ☀️",)]
            if site.strip() != "s1":
                con.execute("DELETE FROM sites WHERE site_id = ?", [site.strip()])
            else:
                con.execute("UPDATE sites SET name = NULL WHERE site_id = 's1'")
        assert cli_snapshot(shell.warehouse) == before
    else:
        assert_refused(result)
        assert cli_snapshot(shell.warehouse) == before


INSTANTS = st.one_of(st.text(max_size=25), st.sampled_from(
    ["2026-11-30T12:00:00+00:00", "2026-11-30", "yesterday", "2026-02-30T00:00:00Z", ""]))


@duckdb_only
@PROPERTY_SETTINGS
@given(account=ACCOUNT_IDS, at=INSTANTS)
def test_sync_now_and_plan_refuse_bad_input_without_writing(shell, account, at):
    check_sync_now_and_plan(shell, account, at)


@postgres_only
@POSTGRES_PROPERTY_SETTINGS
@given(account=ACCOUNT_IDS, at=INSTANTS)
def test_sync_now_and_plan_refuse_bad_input_without_writing_on_postgres(shell, account, at):
    check_sync_now_and_plan(shell, account, at)


def check_sync_now_and_plan(shell, account, at) -> None:
    before = cli_snapshot(shell.warehouse)
    result = shell("sync-now", account)
    if not printed_help(result, account):
        # Nothing is linked: a well-formed id is refused as unknown, a malformed one as
        # malformed.
        assert_refused(result)
        assert ("is not linked" in result[2]) == is_account(account), result
    code, out, err = shell("plan", "--at", at, "--json")
    if code == 0:
        assert json.loads(out) == [] and err == ""
    else:
        assert_refused((code, out, err))
    assert cli_snapshot(shell.warehouse) == before


@duckdb_only  # refused before the warehouse is opened
@pytest.mark.parametrize("at", [
    "0001-01-01000+0001", "0001-01-01T00:00:00Z", "0001-01-05T00:00:00Z",
    "9999-12-31T23:00:00Z", "9999-12-31T23:00:00-05:00",
])
def test_plan_refuses_an_instant_its_days_cannot_reach(shell, at):
    """Days around the instant, in zones on both sides of UTC, must exist as dates."""
    for account, timezone in (("act_1", "Pacific/Kiritimati"), ("act_2", "Pacific/Pago_Pago")):
        assert shell("link", "s1", account, "--connection", "c1", "--timezone", timezone,
                     "--currency", "USD")[0] == 0
    before = cli_snapshot(shell.warehouse)
    result = shell("plan", "--at", at, "--json")
    assert_refused(result)
    assert "--at" in result[2]
    assert cli_snapshot(shell.warehouse) == before
