"""The product's shared vocabulary: how a sync ended, what it read, its error line, a count.

The contract names these values (`meta_sync_runs.outcome`, `.kind`, the
`CODE: message` error codes, `rastro status`'s states, `rastro plan`'s
kinds); the sync, the planner, the catalog sync and the CLI all speak them,
so they are written once, here, with how the product says a count in words
(the CLI and the UI's checks). Each enum is a `StrEnum`: its members are the
contract's strings, as stored in DuckDB and printed in JSON.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Outcome(StrEnum):
    """How one account sync ended (`meta_sync_runs.outcome`)."""

    OK = "ok"
    TOKEN = "token"
    THROTTLED = "throttled"
    PERMISSION = "permission"
    KEY = "key"
    OTHER = "other"


class SyncKind(StrEnum):
    """What a sync read (`meta_sync_runs.kind`)."""

    BACKFILL = "backfill"
    GAP = "gap"
    LIVE = "live"
    DAILY = "daily"
    WEEKLY = "weekly"
    MANUAL = "manual"


FILL_KINDS = (SyncKind.BACKFILL, SyncKind.GAP)
"""Syncs that fill days never read: their last block, which reaches the account's local
today, reads the full catalog and counts as the daily and weekly re-sync: the fill has just
read every day up to today (docs/cadence.md, "The cadence")."""


class PlanKind(StrEnum):
    """What the planner says an account reads next (`rastro plan`'s `kind`)."""

    BACKFILL = "backfill"
    GAP = "gap"
    LIVE = "live"
    DAILY = "daily"
    WEEKLY = "weekly"
    PAUSED = "paused"


class ConnectionStatus(StrEnum):
    """Whether a connection's token may be used (`meta_connections.status`)."""

    ACTIVE = "active"
    INVALID = "invalid"  # Meta refused it: every account it serves pauses


class AccountHealth(StrEnum):
    """How an account is doing (`rastro status`'s `state`)."""

    BACKFILLING = "backfilling"
    LIVE = "live"
    ERROR = "error"
    PAUSED = "paused"
    # A new token replaced the one its last sync died on; no sync has ended since.
    WAITING = "waiting"


ERROR_CODES: dict[Outcome, str] = {
    Outcome.TOKEN: "META_TOKEN_INVALID",
    Outcome.THROTTLED: "RATE_LIMITED",
    Outcome.PERMISSION: "META_PERMISSION",
    Outcome.KEY: "SECRETS_KEY_MISSING",
    Outcome.OTHER: "META_UNAVAILABLE",
}
"""The contract's error code of each failed outcome."""

MAX_ERROR_CHARS = 300
"""An error line is cut here: it is stored, shown by `rastro status` and in run logs."""

RUN_TIMEOUT_ERROR = "RUN_TIMEOUT: the previous sync did not finish"

# How a sync or catalog read refused for an already invalid token words its error.
RESTATED_INVALID = "the connection's token is invalid"

_CODE_PREFIX = re.compile(r"^[A-Z][A-Z0-9_]*: ")


def error_line(outcome: Outcome | str, message: str) -> str:
    """The contract's `CODE: message` for a failed outcome, cut to `MAX_ERROR_CHARS`."""
    return f"{ERROR_CODES[Outcome(outcome)]}: {message}"[:MAX_ERROR_CHARS]


def coded(code: str, message: str | None, default: str) -> str:
    """`message` if it already carries a code, else `CODE: message` (or `default`)."""
    if message and _CODE_PREFIX.match(message):
        return message
    return f"{code}: {message or default}"


ERRORS_GUIDE = "docs/errors.md"
"""The guide's page of error codes: a section for each, named after it."""

GUIDED_CODES = frozenset({*ERROR_CODES.values(), "META_TRUNCATED", "RUN_TIMEOUT"})
"""The codes `ERRORS_GUIDE` has a section for."""


def error_code(error: str | None) -> str | None:
    """The code of a `CODE: message` line the guide explains; None for any other line."""
    code = (error or "").split(":", 1)[0]
    return code if code in GUIDED_CODES else None


def guide_reference(codes: list[str]) -> str:
    """Where the guide says what to do about `codes`: its page and their sections."""
    return ", ".join([ERRORS_GUIDE, *(f'"{code}"' for code in dict.fromkeys(codes))])


def with_guide(error: str) -> str:
    """`error` followed by where the guide says what to do about it, when it names a code."""
    code = error_code(error)
    return f"{error} ({guide_reference([code])})" if code else error


def counted(count: int, noun: str) -> str:
    """`1 account`, `2 accounts`: the count with its noun in the right number."""
    return f"{count} {noun if count == 1 else noun + 's'}"
