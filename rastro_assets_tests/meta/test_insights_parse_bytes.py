"""Insights pages read straight from their bytes (Arrow's JSON reader) answer exactly as
`json.loads` and the checked per-row reference (`parse_insight_table`) do: the same table
and paging, or, when the byte reader is unsure, nothing, so the client takes the reference
and gives its answer."""

from __future__ import annotations

import contextlib
import json
from datetime import date
from decimal import Decimal
from unittest import mock

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rastro_assets.meta import client as client_module
from rastro_assets.meta import insights
from rastro_assets.meta.errors import MetaError
from rastro_assets.meta.insights_parse import parse_insight_table, read_insights_page
from rastro_assets.meta.models import INSIGHT_SCHEMA
from rastro_assets.spend_schema import COUNT_MAX
from rastro_assets_tests.insight_rows import chunk_rows
from rastro_assets_tests.meta.conftest import BASE_URL, BRL, JPY, TOKEN, ClientFactory, truth_rows
from rastro_assets_tests.meta.insight_pages import (
    MESSAGING,
    PLAIN_PAGE,
    SINCE,
    UNTIL,
    odd_rows,
    plain_rows,
    rows,
)

NEXT = f"{BASE_URL}/{BRL}/insights?limit=500&after=QVFI"

# Text spliced into a serialised body in place of a placeholder string, so that a body
# may hold what `json.dumps` never writes: numbers of every spelling, NaN, escapes,
# deep nesting, raw control characters, invalid UTF-8, encoded surrogates.
RAW_VALUES = [
    b"5", b"0", b"-0", b"1.0", b"1e3", b"1E+3", b"-1", b"0.1e-999", b"1e999",
    b"99999999999999999999999999", b"NaN", b"Infinity", b"-Infinity", b"true", b"false",
    b"null", b"{}", b"[]", b"[null]", b'[{"action_type":"x","value":"1"}]',
    b'"\\ud83d"', b'"\\udc00x"', b'"\\ud83d\\ude00"', b'"\\ud83dx"', b'"a\\u0000b"',
    b'"\\/\\u00e7\\u00E7"', b'"\\t\\n\\r\\b\\f\\"\\\\"', b'"\\x"', b'"\\u12"',
    b'"a\tb"', b'"a\nb"', b'"a\x00b"', b'"a\x1fb"', b'"a\x7fb"',
    b'"\xff"', b'"\xc3"', b'"\x80"', b'"\xc0\x80"', b'"\xe0\x80\x80"', b'"\xed\xa0\xbd"',
    b'"\xed\xb0\x80"', b'"\xf4\x90\x80\x80"', b'"\xf5\x80\x80\x80"', b'"\xc3\xa7"',
    b'"\xf0\x9f\x98\x80"', b'"\xef\xbb\xbf"',
    b"[" * 3000 + b"]" * 3000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b"01", b"1.", b".5", b"+1", b"'x'", b'"x",', b"",
]
# Keys spliced in the same way: duplicates of the real keys, escaped spellings of them,
# keys no schema names.
RAW_KEYS = [
    b'"ad_id"', b'"spend"', b'"impressions"', b'"actions"', b'"ad_name"', b'"date_start"',
    b'"\\u0061d_id"', b'"sp\\u0065nd"', b'"value"', b'"action_type"', b'"data"', b'"paging"',
    b'"next"', b'"after"', b'"cursors"', b'"error"', b'"1d_click"', b'"unknown"', b'"ad_id\\u0000"',
    b'"\xff"', b'"ad_id" ',
]
PAGINGS = st.one_of(
    st.just(None),
    st.fixed_dictionaries(
        {},
        optional={
            "cursors": st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {}, optional={"before": st.just("QVFB"),
                                  "after": st.sampled_from(["QVFI", "", "Q\u00e7"])}
                ),
            ),
            "next": st.sampled_from([NEXT, "", f"{NEXT}&access_token=x",
                                     "https://elsewhere.test/v25.0/act_1/insights", "not a url"]),
            "previous": st.just(NEXT),
        },
    ),
)


class Splicer:
    """Placeholders for raw text, and the splicing of it into the serialised body."""

    def __init__(self) -> None:
        self.raw: dict[bytes, bytes] = {}

    def value(self, text: bytes) -> str:
        marker = f"@@value{len(self.raw)}@@"
        self.raw[json.dumps(marker).encode()] = text
        return marker

    def key(self, text: bytes) -> str:
        marker = f"@@key{len(self.raw)}@@"
        self.raw[json.dumps(marker).encode()] = text
        return marker

    def splice(self, body: bytes) -> bytes:
        for marker, text in self.raw.items():
            body = body.replace(marker, text)
        return body


def _spoil(draw, obj: dict, splicer: Splicer) -> dict:
    """`obj` with one value replaced, or one key added, by raw text."""
    if draw(st.booleans()) and obj:
        key = draw(st.sampled_from(sorted(obj)))
        return {**obj, key: splicer.value(draw(st.sampled_from(RAW_VALUES)))}
    items = list(obj.items())
    at = draw(st.integers(0, len(items)))
    value = draw(st.one_of(st.just("x"), st.sampled_from(RAW_VALUES).map(splicer.value)))
    items.insert(at, (splicer.key(draw(st.sampled_from(RAW_KEYS))), value))
    return dict(items)


@st.composite
def meta_rows(draw) -> dict:
    """Rows as Meta sends them (no attribution windows, which the byte path leaves to json),
    some with names of any text (astral characters become surrogate pairs in ASCII JSON)."""
    row = draw(plain_rows())
    if "actions" in row:
        row["actions"] = [{key: action[key] for key in ("action_type", "value")}
                          for action in row["actions"]]
    if draw(st.booleans()):
        row["ad_name"] = draw(st.text(max_size=8))
    return row


@st.composite
def page_objects(draw, splicer: Splicer) -> object:
    if draw(st.booleans()):
        data = draw(st.lists(meta_rows(), max_size=5))
    else:
        data = draw(st.lists(st.one_of(plain_rows(), odd_rows(), rows()), max_size=5))
    data = [
        {key: splicer.value(str(value).encode()) if isinstance(value, Decimal) else value
         for key, value in row.items()} if isinstance(row, dict) else row
        for row in data
    ]
    page: dict = {"data": data}
    paging = draw(PAGINGS)
    if paging is not None:
        page["paging"] = paging
    spoil = draw(st.integers(0, 9))
    if spoil == 0:
        page = _spoil(draw, page, splicer)
    elif spoil == 1 and paging:
        page["paging"] = _spoil(draw, paging, splicer)
    elif spoil == 2 and paging and isinstance(paging.get("cursors"), dict):
        page["paging"] = {**paging, "cursors": _spoil(draw, paging["cursors"], splicer)}
    elif spoil in (3, 4, 5):
        rows_ = [index for index, row in enumerate(data) if isinstance(row, dict)]
        if rows_:
            index = draw(st.sampled_from(rows_))
            row = data[index]
            actions = row.get("actions")
            first = actions[0] if isinstance(actions, list) and actions else None
            if spoil == 5 and isinstance(first, dict):
                row = {**row, "actions": [_spoil(draw, first, splicer), *actions[1:]]}
            else:
                row = _spoil(draw, row, splicer)
            data[index] = row
    elif spoil == 6:
        page = draw(st.sampled_from([
            {"paging": paging or {}}, {"data": None}, {"data": {}}, {"data": "x"}, [data],
            "data", {"data": data, "error": {"code": 1, "message": "Please reduce the amount of"
                                               " data you're asking for, then retry"}},
            {"data": data, "error": "not an object"},
            {"error": {"code": 100, "message": "Invalid parameter"}, "data": data},
        ]))
    return page


@st.composite
def bodies(draw) -> bytes:
    """A page serialised as Meta, `json.dumps` or a person might, sometimes spoilt."""
    splicer = Splicer()
    page = draw(page_objects(splicer))
    style = draw(st.sampled_from(["compact", "ascii", "default", "indent", "sorted"]))
    try:
        if style == "compact":
            text = json.dumps(page, ensure_ascii=False, separators=(",", ":"))
        elif style == "ascii":
            text = json.dumps(page, separators=(",", ":"))
        elif style == "default":
            text = json.dumps(page)
        elif style == "indent":
            text = json.dumps(page, indent=1, ensure_ascii=False)
        else:
            text = json.dumps(page, sort_keys=True, ensure_ascii=False)
    except TypeError:
        assume(False)  # rows() draws a few values json cannot write (mixed key types)
        raise
    body = splicer.splice(text.encode("utf-8", "surrogatepass"))
    edit = draw(st.integers(0, 14))
    if edit == 0:
        body = draw(st.sampled_from([b"\xef\xbb\xbf", b" ", b"\n", b"\t", b"\x00"])) + body
    elif edit == 1:
        body += draw(st.sampled_from([b"\n", b" ", b"\r\n", b"{}", b'{"data":[]}', b"x",
                                      b"\x00", b"\n\n", b"null", b"\n{}", b"]", b"}"]))
    elif edit == 2 and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif edit == 3:
        body = body.replace(b"\n", b"\r\n")
    return body


def by_json(body: bytes):
    """The page as the client reads a body the byte reader refuses (`json.loads`, then the
    per-row reference): (table, next, after), or the refusal."""
    try:
        page = json.loads(body, parse_float=Decimal)
    except (ValueError, RecursionError) as exc:
        return f"json refuses: {type(exc).__name__}"
    if not isinstance(page, dict) or isinstance(page.get("error"), dict):
        return "an error or not an object"
    data = page.get("data")
    if not isinstance(data, list):
        return "no data list"
    try:
        table = parse_insight_table(data, SINCE, UNTIL)
    except MetaError as exc:
        return f"{type(exc).__name__}: {exc}"
    paging = page.get("paging")
    paging = paging if isinstance(paging, dict) else {}
    cursors = paging.get("cursors")
    after = cursors.get("after") if isinstance(cursors, dict) else None
    return table, paging.get("next"), after


def assert_same_page(body: bytes) -> bool:
    """The byte reader agrees with the reference; True when it read the page itself."""
    page = read_insights_page(body, SINCE, UNTIL)
    if page is None:
        return False
    expected = by_json(body)
    assert not isinstance(expected, str), f"the byte path read a body json does not: {expected}"
    table, next_url, after = expected
    assert page.table.schema.equals(INSIGHT_SCHEMA)
    assert page.table.equals(table)
    assert page.table.to_pylist() == table.to_pylist()
    # The client reads `next` for its truth and its text, `after` if a non-empty string.
    assert (bool(page.next_url), page.next_url or None) == (bool(next_url), next_url or None)
    assert type(page.next_url) in (str, type(None))
    plain_after = after if isinstance(after, str) and after else None
    assert (page.after or None) == plain_after
    return True


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_bodies_read_from_bytes_as_json_reads_them(body) -> None:
    assert_same_page(body)


@st.composite
def plain_bodies(draw) -> bytes:
    page: dict = {"data": draw(st.lists(meta_rows(), max_size=6))}
    paging = draw(PAGINGS)
    if paging is not None:
        page["paging"] = paging
    ensure_ascii = draw(st.booleans())
    indent = draw(st.sampled_from([None, None, 1]))
    return json.dumps(page, ensure_ascii=ensure_ascii, indent=indent).encode()


def messaging_total(body: bytes) -> int:
    return sum(int(action["value"]) for row in json.loads(body)["data"]
               for action in row.get("actions", ()) if action["action_type"] == MESSAGING)


@settings(max_examples=200, deadline=None)
@given(plain_bodies())
def test_plain_bodies_are_read_from_their_bytes(body) -> None:
    # A body as Meta sends it never takes the reference, but for one case the byte
    # reader leaves to it: messaging conversations summing past 64 bits over the page
    # (the kernels sum the page's at once; the reference words a row's refusal).
    read = assert_same_page(body)
    assert read == (messaging_total(body) <= COUNT_MAX), body[:300]


def test_a_plain_page_from_bytes_is_the_references_table() -> None:
    data = [{**row, "actions": [{key: action[key] for key in ("action_type", "value")}
                                for action in row.get("actions", ())]} for row in PLAIN_PAGE]
    body = json.dumps({"data": data, "paging": {"cursors": {"after": "QVFI"}, "next": NEXT}})
    page = read_insights_page(body.encode(), SINCE, UNTIL)
    assert page is not None
    assert page.table.equals(parse_insight_table(data, SINCE, UNTIL))
    assert (page.next_url, page.after) == (NEXT, "QVFI")
    empty = read_insights_page(b'{"data":[]}', SINCE, UNTIL)
    assert empty is not None and empty.table.equals(INSIGHT_SCHEMA.empty_table())


@pytest.mark.parametrize("spoilt", [
    {"spend": "1.23456"}, {"spend": "100000000000000"}, {"spend": "1e3"}, {"spend": " 1"},
    {"impressions": "9223372036854775808"}, {"impressions": "-1"}, {"clicks": "1.0"},
    {"ad_id": ""}, {"date_start": "2026-03-04", "date_stop": "2026-03-04"},
    {"date_stop": "2026-03-02"}, {"date_start": "20260303", "date_stop": "20260303"},
    {"actions": [{"action_type": MESSAGING, "value": "9223372036854775807"}] * 2},
    {"actions": [{"action_type": MESSAGING}]},
])
def test_the_byte_reader_leaves_odd_rows_to_the_reference(spoilt) -> None:
    # Refused or read otherwise by the reference: the byte reader never words a refusal.
    body = json.dumps({"data": [PLAIN_PAGE[1], {**PLAIN_PAGE[1], **spoilt}]}).encode()
    assert read_insights_page(body, SINCE, UNTIL) is None


def test_the_byte_path_refuses_what_json_reads_differently() -> None:
    row = ('{"ad_id":"1","date_start":"2026-03-01","date_stop":"2026-03-01","spend":"1",'
           '"impressions":IMPRESSIONS}')

    def page(impressions: str, after: str = "") -> str:
        return '{"data":[' + row.replace("IMPRESSIONS", impressions) + "]" + after + "}"

    plain = page('"5"').encode()
    assert read_insights_page(plain, SINCE, UNTIL) is not None
    for body in [
        page("5"),  # json: int 5, a count; an ad name 5 would be no name
        page('"5","impressions":"6"'),  # json keeps the last
        page('"5"', ',"error":{"code":1,"message":"x"}'),
        page('"5"', ',"x":' + "[" * 5000 + "]" * 5000),  # json: RecursionError
        page('"5"') + '\n{"data":[]}',
        page('"\\udc00"'),
    ]:
        assert read_insights_page(body.encode(), SINCE, UNTIL) is None, body[:80]
    for bad_utf8 in [b"\xff", b"\xed\xa0\xbd", b"\xc0\x80"]:
        body = plain.replace(b'"1","date_start"', b'"1","account_currency":"' + bad_utf8
                             + b'","date_start"')
        assert read_insights_page(body, SINCE, UNTIL) is None


# -- through the client ------------------------------------------------------------


def run_client(body: bytes, *, byte_path: bool):
    """What `MetaClient.insights` makes of `body` as every first page: chunks or the error."""
    urls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        urls.append(f"{request.method} {request.url}")
        if "after" in request.url.params or "elsewhere" in request.url.host:
            return httpx.Response(200, content=b'{"data":[]}')
        return httpx.Response(200, content=body, headers={
            "X-App-Usage": '{"call_count":28,"total_time":25,"total_cputime":25}'})

    client = client_module.MetaClient(
        TOKEN, base_url=BASE_URL, transport=httpx.MockTransport(answer), max_retries=1,
        sleep=lambda seconds: None, async_poll_seconds=0, async_timeout_seconds=0,
    )
    patch = mock.patch.object(insights, "read_insights_page", lambda *args: None)
    try:
        with client, (contextlib.nullcontext() if byte_path else patch):
            chunks = list(client.insights(BRL, SINCE, UNTIL))
    except Exception as exc:  # noqa: BLE001 - any outcome is compared
        outcome = (type(exc).__name__, str(exc), getattr(exc, "kind", None))
    else:
        outcome = [(c.since, c.until, c.complete, c.table.to_pylist()) for c in chunks]
    return outcome, urls, client.stats


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(bodies(), plain_bodies()))
def test_the_client_answers_the_same_either_way(body) -> None:
    assert run_client(body, byte_path=True) == run_client(body, byte_path=False)


# -- the fake Graph -----------------------------------------------------------------


@pytest.mark.parametrize("account", [BRL, JPY])
def test_the_fake_graphs_pages_never_fall_back(
    world, client_for: ClientFactory, monkeypatch, account: str
) -> None:
    def json_path(*args, **kwargs):
        raise AssertionError("a page of the fake Graph was read with json.loads")

    monkeypatch.setattr(insights, "parse_insight_table", json_path)
    world.row_cap = 5  # some days run as async reports, whose pages are insights pages too
    client = client_for(page_size=4)
    since, until = date(2026, 2, 20), date(2026, 3, 15)
    chunks = list(client.insights(account, since, until))
    assert all(chunk.complete for chunk in chunks)
    got = {row for chunk in chunks for row in chunk_rows(chunk)}
    assert got == truth_rows(world, account, since, until)
    assert world.calls["report_insights"] >= 1


def test_a_body_with_an_attribution_window_is_read_by_json_alike() -> None:
    body = json.dumps({"data": [{
        "ad_id": "1", "date_start": "2026-03-01", "date_stop": "2026-03-01", "spend": "2.5",
        "actions": [{"action_type": MESSAGING, "value": "3", "7d_click": "3"}],
    }]}).encode()
    assert read_insights_page(body, SINCE, UNTIL) is None
    assert run_client(body, byte_path=True) == run_client(body, byte_path=False)


# -- page URLs ----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=12))
def test_page_urls_are_the_ones_httpx_builds_from_the_params(cursor) -> None:
    """The client encodes a read's query once; each page's URL is still httpx's own."""
    seen: list[httpx.Request] = []
    day = date(2026, 3, 1)

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        paging = {} if seen[1:] else {"cursors": {"after": cursor}, "next": NEXT}
        return httpx.Response(200, json={"data": [], "paging": paging})

    with client_module.MetaClient(TOKEN, base_url=BASE_URL,
                                  transport=httpx.MockTransport(answer)) as client:
        list(client.insights(BRL, day, day))
        params = client._insights._insights_params(day, day) | {"limit": "500"}
    expected = [httpx.Request("GET", f"{BASE_URL}/{BRL}/insights", params=params),
                httpx.Request("GET", f"{BASE_URL}/{BRL}/insights",
                              params=params | {"after": cursor})]
    assert [str(request.url) for request in seen] == [str(request.url) for request in expected]
