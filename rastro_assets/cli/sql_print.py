"""How `rastro sql` prints a result, exactly: aligned columns for people (`table`), `csv` or
`json` for scripts."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import unicodedata
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import wcwidth

from rastro_assets.cli.context import Context

FORMATS = ("table", "csv", "json")
NULL_TEXT = "NULL"


def print_result(ctx: Context, fmt: str, names: Sequence[str], rows: Sequence[tuple]) -> None:
    if fmt == "json":
        _print_json(ctx, names, rows)
    elif fmt == "csv":
        _print_csv(ctx, names, rows)
    else:
        _print_table(ctx, names, rows)


def _print_json(ctx: Context, names: Sequence[str], rows: Sequence[tuple]) -> None:
    keys = _unique(names)
    if not rows:
        ctx.stdout.write("[]\n")
        return
    lines = [
        json.dumps(
            {key: _jsonable(value) for key, value in zip(keys, row, strict=True)},
            ensure_ascii=False,
            allow_nan=False,
        )
        for row in rows
    ]
    ctx.stdout.write("[\n" + ",\n".join(lines) + "\n]\n")


def _print_csv(ctx: Context, names: Sequence[str], rows: Sequence[tuple]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow(["" if value is None else _text(value, blob=_base64) for value in row])
    ctx.stdout.write(buffer.getvalue())


def _print_table(ctx: Context, names: Sequence[str], rows: Sequence[tuple]) -> None:
    cells = [[_cell(value) for value in row] for row in rows]
    header = [_escape(name) for name in names]
    widths = [
        max([display_width(name)] + [display_width(row[i]) for row in cells])
        for i, name in enumerate(header)
    ]
    numeric = [
        any(_is_number(row[i]) for row in rows)
        and all(row[i] is None or _is_number(row[i]) for row in rows)
        for i in range(len(names))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            _pad(value, width, right)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(header), line(["-" * width for width in widths])]
    out.extend(line(row) for row in cells)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    ctx.stdout.write("\n".join(out) + "\n")


def display_width(text: str) -> int:
    """The columns `text` takes in a terminal, which `len` gets wrong: a Japanese, Chinese
    or Korean character takes two, as does an emoji however many code points draw it (a
    flag, a skin tone, a family joined by ZWJ, a heart with VS16), and a combining mark
    none. wcwidth's tables follow Unicode's releases and clusters; the standard library's
    `unicodedata` knows neither clusters nor the emoji newer than the interpreter.

    For text without control characters (`_escape` writes them out); with one, wcwidth
    cannot tell, and each code point counts one.
    """
    width = wcwidth.wcswidth(text)
    return width if width >= 0 else len(text)


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * (width - display_width(text))
    return fill + text if right else text + fill


def _unique(names: Sequence[str]) -> list[str]:
    """Column names as JSON keys: a repeated name gets `_1`, `_2`... as DuckDB's own tools do."""
    seen: set[str] = set()
    keys = []
    for name in names:
        key, n = name, 0
        while key in seen:
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return NULL_TEXT
    return _escape(_text(value, blob=lambda raw: f"<blob: {len(raw)} bytes>"))


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(text: str) -> str:
    """`text` on one line of printable characters. A control character would break the
    line, move the cursor or restyle the terminal (an ad's name is Meta's to choose), and
    takes no column anyone can count: each is written out as `\\xNN`."""
    return "".join(
        _ESCAPES.get(char)
        or (f"\\x{ord(char):02x}" if unicodedata.category(char) == "Cc" else char)
        for char in text
    )


def _text(value: Any, *, blob) -> str:
    """One value as text, for the table and CSV."""
    if isinstance(value, bytes | bytearray | memoryview):
        return blob(bytes(value))
    if isinstance(value, list | tuple | dict):
        return json.dumps(_jsonable(value), ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    jsonable = _jsonable(value)
    return jsonable if isinstance(jsonable, str) else str(jsonable)


def _base64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _jsonable(value: Any) -> Any:
    """A value JSON can carry without losing anything."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _base64(bytes(value))
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(_jsonable(key)): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(item) for item in value]
    return str(value)


def _duration(delta: timedelta) -> str:
    """An ISO 8601 duration: `P1DT2H3M4.5S`, `-PT30M`, `PT0S`."""
    sign = "-" if delta < timedelta(0) else ""
    delta = abs(delta)
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = f"{delta.days}D" if delta.days else ""
    clock = ""
    if hours:
        clock += f"{hours}H"
    if minutes:
        clock += f"{minutes}M"
    if seconds or delta.microseconds or not (parts or clock):
        fraction = f".{delta.microseconds:06d}".rstrip("0") if delta.microseconds else ""
        clock += f"{seconds}{fraction}S"
    return f"{sign}P{parts}{'T' + clock if clock else ''}"
