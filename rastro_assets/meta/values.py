"""Readers of single JSON values as Meta sends them, shared by the parsers and `errors`."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

# Counts beyond this are garbage, and huge exponents would be costly to expand.
MAX_COUNT_DIGITS = 18


def int_or_none(value: Any) -> int | None:
    """A whole number given as an int, a Decimal or a numeric string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | Decimal):
        try:
            number = Decimal(value)
        except (InvalidOperation, ValueError):
            return None
        if (
            number.is_finite()
            and number.adjusted() <= MAX_COUNT_DIGITS
            and number == number.to_integral_value()
        ):
            return int(number)
    return None


def text(value: Any) -> str | None:
    """A non-empty string as valid text; None for anything else."""
    return valid_text(value) if isinstance(value, str) and value else None


def valid_text(value: str) -> str:
    """`value`, with any lone surrogate (a valid JSON escape, but no character) and any
    NUL as U+FFFD.

    `json` decodes `"\\ud83d"` to a str no UTF-8 encoder accepts, and `"\\u0000"` to a
    character PostgreSQL's text cannot hold; stored as is, one such name would fail every
    write of its account. Both engines store the same replacement.
    """
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in value)
    return value
