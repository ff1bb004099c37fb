"""Meta's insights pages into `INSIGHT_SCHEMA` tables, along two paths.

1. The byte reader, `read_insights_page`: an HTTP 200 body is read from its
   bytes by pyarrow's JSON reader, and `_plain_rows` checks every row with
   compute kernels. It reads the plain pages Meta sends and refuses (None)
   any page it is not sure of.
2. The checked per-row reference, `parse_insight_row`, for a page the byte
   reader refuses: `parse_insight_table` takes the page `json.loads` decoded
   row by row through it. It states every field rule and words every refusal.

The byte reader gives exactly what the per-row reader gives, or refuses the page
(the differential tests in `rastro_assets_tests/meta/test_insights_parse_bytes.py`
hold it to that; `test_insights_parse.py` and `test_insights_parse_rows.py`
state the per-row reader's rules). Every check raises `MalformedResponse` with a
message naming the field, never echoing a whole body.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.models import INSIGHT_SCHEMA, InsightRow, insight_table
from rastro_assets.meta.values import int_or_none, text, valid_text
from rastro_assets.spend_schema import (
    COUNT_MAX,
    COUNT_TYPE,
    SPEND_INTEGER_DIGITS,
    SPEND_QUANTUM,
    SPEND_SCALE,
    SPEND_TYPE,
)

MESSAGING_CONVERSATION_ACTION = "onsite_conversion.messaging_conversation_started_7d"

# A figure beyond what the warehouse holds (`spend_schema`) is refused here,
# with the field named, rather than by the writer.


def _count(obj: Mapping[str, Any], key: str, what: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0
    number = int_or_none(value)
    if number is None or number < 0:
        raise MalformedResponse(f"{what} has a {key!r} that is not a whole count: {value!r:.40}")
    if number > COUNT_MAX:
        raise MalformedResponse(
            f"{what} has a {key!r} too large for a 64-bit integer: {value!r:.40}"
        )
    return number


def parse_spend(value: Any, what: str) -> Decimal:
    """Meta's spend string as an exact Decimal (JSON floats arrive as Decimal)."""
    if isinstance(value, bool) or value is None:
        raise MalformedResponse(f"{what} has no 'spend'")
    if isinstance(value, str | int | Decimal):
        try:
            spend = Decimal(value.strip() if isinstance(value, str) else value)
        except (InvalidOperation, ValueError):
            raise MalformedResponse(f"{what} has a non-numeric spend: {value!r:.40}") from None
        if spend.is_finite():
            if spend.adjusted() >= SPEND_INTEGER_DIGITS:
                raise MalformedResponse(
                    f"{what} has a spend too large for DECIMAL(18,4): {value!r:.40}"
                )
            if spend != spend.quantize(SPEND_QUANTUM):
                raise MalformedResponse(
                    f"{what} has a spend with more than 4 decimal places, which DECIMAL(18,4)"
                    f" cannot hold exactly: {value!r:.40}"
                )
            return spend
    raise MalformedResponse(f"{what} has a non-numeric spend: {value!r:.40}")


def _conversations(row: Mapping[str, Any], what: str) -> int:
    actions = row.get("actions")
    if actions is None:
        return 0
    if not isinstance(actions, list):
        raise MalformedResponse(f"{what} has 'actions' that is not a list")
    total = 0
    for action in actions:
        if not isinstance(action, Mapping):
            raise MalformedResponse(f"{what} has an action that is not an object")
        if action.get("action_type") != MESSAGING_CONVERSATION_ACTION:
            continue
        value = int_or_none(action.get("value"))
        if value is None or value < 0:
            raise MalformedResponse(
                f"{what} has a messaging conversation count that is not a whole number: "
                f"{action.get('value')!r:.40}"
            )
        total += value
    if total > COUNT_MAX:
        raise MalformedResponse(
            f"{what} has more messaging conversations than a 64-bit integer holds"
        )
    return total


def _day(row: Mapping[str, Any], key: str, what: str) -> date:
    value = row.get(key)
    if not isinstance(value, str):
        raise MalformedResponse(f"{what} has no {key!r}")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise MalformedResponse(f"{what} has an unreadable {key!r}: {value!r:.40}") from None


def parse_insight_row(row: Any, since: date, until: date) -> InsightRow:
    """One `level=ad, time_increment=1` row, checked against the asked range."""
    if not isinstance(row, Mapping):
        raise MalformedResponse("an insights row is not an object")
    ad_id = row.get("ad_id")
    if not isinstance(ad_id, str | int) or isinstance(ad_id, bool) or not str(ad_id):
        raise MalformedResponse("an insights row has no 'ad_id'")
    ad_id = str(ad_id)
    if valid_text(ad_id) != ad_id:
        raise MalformedResponse("an insights row has an 'ad_id' that is not valid text")
    what = f"insights row for ad {ad_id}"
    start = _day(row, "date_start", what)
    stop = _day(row, "date_stop", what)
    if start != stop:
        raise MalformedResponse(
            f"{what} spans {start}..{stop}; time_increment=1 rows must cover one day"
        )
    if not since <= start <= until:
        raise MalformedResponse(f"{what} is dated {start}, outside the asked {since}..{until}")
    if "spend" not in row:
        raise MalformedResponse(f"{what} on {start} has no 'spend'")
    return InsightRow(
        ad_id=ad_id,
        day=start,
        spend=parse_spend(row.get("spend"), f"{what} on {start}"),
        impressions=_count(row, "impressions", what),
        clicks=_count(row, "clicks", what),
        conversations=_conversations(row, what),
        ad_name=text(row.get("ad_name")),
        adset_id=text(row.get("adset_id")),
        adset_name=text(row.get("adset_name")),
        campaign_id=text(row.get("campaign_id")),
        campaign_name=text(row.get("campaign_name")),
    )


# The row fields the byte reader reads, every one as a string (and the actions).
_RAW_ACTION = pa.struct([("action_type", pa.string()), ("value", pa.string())])
_ROW_TEXTS = (
    "ad_id", "date_start", "date_stop", "spend", "impressions", "clicks",
    "ad_name", "adset_id", "adset_name", "campaign_id", "campaign_name",
)
# The spend strings `parse_spend` accepts that a cast reads to the same value.
# Its other spellings (" 1.5", "1e3", "+2", leading zeros past 14 digits) are
# rare enough to leave to the per-row reference. RE2: `$` is the end of the text.
_PLAIN_SPEND = rf"^-?[0-9]{{1,{SPEND_INTEGER_DIGITS}}}(\.[0-9]{{1,{SPEND_SCALE}}})?$"
_NULL_TEXT = pa.scalar(None, pa.string())
_ZERO = pa.array([0], COUNT_TYPE)

# An insights body as Meta sends it, every key it may hold named. The reader
# refuses any other key (at any depth, "error" included), a duplicated key,
# and any number, boolean or nesting where these shapes do not allow one, so
# an accepted body holds only strings and nulls, each in one of these columns,
# and nests at most five deep (`json` raises RecursionError past ~1000).
# Attribution-window keys in actions ("7d_click", ...) are left to `json` too:
# naming them would slow every read, filling their null columns (bench/README.md).
_BODY_ROW = pa.struct(
    [(name, pa.string()) for name in (*_ROW_TEXTS, "account_currency")]
    + [("actions", pa.list_(_RAW_ACTION))]
)
_BODY_SCHEMA = pa.schema([
    ("data", pa.list_(_BODY_ROW)),
    ("paging", pa.struct([
        ("cursors", pa.struct([("before", pa.string()), ("after", pa.string())])),
        ("next", pa.string()),
        ("previous", pa.string()),
    ])),
])
_BODY_PARSE = pa_json.ParseOptions(explicit_schema=_BODY_SCHEMA, unexpected_field_behavior="error")
# The reader's block size is an int32; a body this large is read by `json`.
_MAX_BODY_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class InsightsPage:
    """An insights page read from its bytes: its rows, checked, and its paging."""

    table: pa.Table  # INSIGHT_SCHEMA, in page order
    next_url: str | None  # `paging.next`
    after: str | None  # `paging.cursors.after`

    @property
    def data(self) -> pa.Table:
        """The rows, as `GraphSession.pages` hands a page on."""
        return self.table


def parse_insight_table(raw_rows: Any, since: date, until: date) -> pa.Table:
    """A page's `data`, as `json.loads` decodes it, as an `INSIGHT_SCHEMA` table in page order.

    The per-row path: every row, in order, goes through `parse_insight_row`, so
    the values and every error are the ones it gives. The client takes this
    path only for a body `read_insights_page` refuses; what that reads from
    the bytes is what this gives for the decoded page.
    """
    return insight_table([parse_insight_row(raw, since, until) for raw in raw_rows])


def read_insights_page(body: bytes, since: date, until: date) -> InsightsPage | None:
    """An HTTP 200 insights body read straight from its bytes, when that is sure to be exact.

    Arrow's JSON reader parses the bytes in C++ without the GIL and without
    building Python objects; `_plain_rows` then checks the rows with compute
    kernels, no Python per row. None (read the body with `json.loads` and the
    per-row reference, `parse_insight_table`) for anything that is not plain:
    a body that is not one JSON object starting with `{`, any key or type
    outside `_BODY_SCHEMA`, a duplicated key, invalid UTF-8, a lone surrogate,
    a NUL in an ad id, a null or odd row. What comes back is then what `parse_insight_table` gives.
    """
    # `json` guesses UTF-16/32 from NULs in the first four bytes and skips a BOM.
    if body[:1] != b"{" or b"\x00" in body[:4] or len(body) >= _MAX_BODY_BYTES:
        return None
    try:
        read = pa_json.read_json(
            pa.BufferReader(body),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(body) + 1),
            parse_options=_BODY_PARSE,
        )
        if read.num_rows != 1:
            return None  # several documents: `json` refuses the extra data
        # The reader does not check UTF-8; `json` refuses what is not UTF-8
        # (and decodes encoded surrogates, which this refuses too).
        read.validate(full=True)
    except (pa.ArrowException, ValueError):
        return None
    data = read.column("data")
    if data.null_count or data.num_chunks != 1:
        return None
    table = _plain_rows(data.chunk(0).flatten(), since, until)
    if table is None:
        return None
    paging = read.column("paging")[0].as_py() or {}
    cursors = paging.get("cursors") or {}
    return InsightsPage(table, paging.get("next"), cursors.get("after"))


def _without_nul(names: pa.Array) -> pa.Array:
    """Names with any NUL as U+FFFD, as `values.valid_text` gives them to the reference."""
    if not pc.match_substring(names, "\x00").true_count:
        return names
    return pc.replace_substring(names, "\x00", "\ufffd")


def _plain_rows(raw: pa.StructArray, since: date, until: date) -> pa.Table | None:
    """The rows' table when every row is plain, else None (the caller reads them in Python).

    `raw` holds at least `_ROW_TEXTS` as strings and `actions` as a list of `_RAW_ACTION`.
    """
    if not len(raw):
        return INSIGHT_SCHEMA.empty_table()
    if raw.null_count:
        return None
    field = dict(zip([column.name for column in raw.type], raw.flatten(), strict=True))
    ad_id, start, spend = field["ad_id"], field["date_start"], field["spend"]
    day_texts, day_values = _days_of(since, until)
    day_index = pc.index_in(start, value_set=day_texts)
    if (
        day_index.null_count
        or ad_id.null_count
        or pc.equal(ad_id, "").true_count
        or not _all_true(pc.equal(field["date_stop"], start))
        or not _all_true(pc.match_substring_regex(spend, _PLAIN_SPEND))
    ):
        return None
    if pc.match_substring(ad_id, "\x00").true_count:
        return None  # the per-row reference refuses it
    try:
        impressions = _plain_count(field["impressions"])
        clicks = _plain_count(field["clicks"])
        conversations = _plain_conversations(field["actions"])
    except pa.ArrowInvalid:
        return None  # a count past 64 bits: the per-row reference words the refusal, if any
    if impressions is None or clicks is None or conversations is None:
        return None
    return pa.Table.from_arrays(
        [
            ad_id,
            day_values.take(day_index),
            spend.cast(SPEND_TYPE),
            impressions,
            clicks,
            conversations,
            *(_empty_as_null(_without_nul(field[name])) for name in INSIGHT_SCHEMA.names[6:]),
        ],
        schema=INSIGHT_SCHEMA,
    )


@functools.lru_cache(maxsize=64)
def _days_of(since: date, until: date) -> tuple[pa.Array, pa.Array]:
    """The ISO spellings of [since, until] and the days themselves, index for index."""
    days = [since + timedelta(days=offset) for offset in range((until - since).days + 1)]
    return pa.array([day.isoformat() for day in days], pa.string()), pa.array(days, pa.date32())


def _all_true(mask: pa.BooleanArray) -> bool:
    return not (mask.null_count or mask.false_count)


def _plain_count(texts: pa.StringArray) -> pa.Array | None:
    """Counts as `_count` reads them (absent: 0); None when one is not ASCII digits.

    Raises ArrowInvalid past 2**63 - 1, which `_count` refuses too.
    """
    if texts.null_count:
        texts = texts.fill_null("0")
    if not _all_true(pc.ascii_is_decimal(texts)):
        return None
    return texts.cast(COUNT_TYPE)


def _plain_conversations(actions: pa.ListArray) -> pa.Array | None:
    """Each row's messaging conversations as `_conversations` sums them; None when unsure.

    Unsure: an action that is null or has no `action_type` (Arrow reads a JSON
    `[]` as an empty object, and `_conversations` refuses an array), or a
    messaging count that is not ASCII digits. Raises ArrowInvalid when the
    page's counts sum past 2**63 - 1, where a row might too.
    """
    entries = actions.values
    if entries.null_count:
        return None
    action_type, value = entries.field("action_type"), entries.field("value")
    if action_type.null_count:
        return None
    messaging = pc.equal(action_type, MESSAGING_CONVERSATION_ACTION)
    counted = value.filter(messaging)
    if not _all_true(pc.ascii_is_decimal(counted)):
        return None
    per_entry = pc.replace_with_mask(
        pa.repeat(_ZERO[0], len(entries)), messaging, counted.cast(COUNT_TYPE)
    )
    # A row's total is the difference of the running sums at its list's bounds.
    running = pa.concat_arrays([_ZERO, pc.cumulative_sum_checked(per_entry)])
    offsets = actions.offsets
    return pc.subtract(running.take(offsets[1:]), running.take(offsets[:-1]))


def _empty_as_null(names: pa.StringArray) -> pa.Array:
    """`text`'s rule for a name column: an empty name is no name."""
    empty = pc.equal(names, "")
    if not empty.true_count:
        return names
    return pc.if_else(empty, _NULL_TEXT, names)
