"""The backfill daemon's log, one line per partition subset rather than every key.

Dagster's backfill daemon logs each subset it considers as `{key, key, ...}`:
for partitions on a time axis it writes ranges, for ours (account x day) every
key, so one 90-day backfill of three accounts is a line of all 270 keys,
logged several times per tick. `summarise_backfill_logs` puts a filter on the
daemon's logger, in the daemon process (the run coordinator installs it, the
one piece of this project the instance loads there), that rewrites such a
list as each account's days: `{270 partitions: act_1001 2026-09-04..2026-12-02
(90 days), ...}`.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict

BACKFILL_LOGGER = "dagster.daemon.BackfillDaemon"
# Lists with more keys than this are summarised; shorter ones say more as they are.
MAX_KEYS = 12
_KEY_LIST = re.compile(r"\{([^{}]*)\}")
_KEY = re.compile(r"[\w.|-]+")


def summarise_keys(keys: list[str]) -> str:
    """`keys` as `N partitions: ` and each account's first..last day (days count)."""
    days: dict[str, list[str]] = defaultdict(list)
    others: list[str] = []
    for key in keys:
        account, sep, day = key.partition("|")
        if sep:
            days[account].append(day)
        else:
            others.append(key)
    parts = [
        f"{account} {min(d)}..{max(d)} ({len(d)} days)" for account, d in sorted(days.items())
    ]
    if others:
        parts.append(f"{len(others)} more: {', '.join(sorted(others)[:3])}, ...")
    if len(parts) > MAX_KEYS:
        parts = [*parts[:MAX_KEYS], f"... {len(parts) - MAX_KEYS} more accounts"]
    return f"{len(keys)} partitions: {', '.join(parts)}"


def summarise_message(message: str) -> str:
    def shorten(match: re.Match[str]) -> str:
        keys = [key.strip() for key in match[1].split(",")]
        if len(keys) <= MAX_KEYS or not all(_KEY.fullmatch(key) for key in keys):
            return match[0]
        return "{" + summarise_keys(keys) + "}"

    return _KEY_LIST.sub(shorten, message)


class KeyListSummary(logging.Filter):
    """Rewrites long key lists in a record's message; lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        if message.count(",") > MAX_KEYS:
            record.msg, record.args = summarise_message(message), None
        return True


def summarise_backfill_logs() -> None:
    """Install the filter on the backfill daemon's logger, once per process."""
    logger = logging.getLogger(BACKFILL_LOGGER)
    if not any(isinstance(f, KeyListSummary) for f in logger.filters):
        logger.addFilter(KeyListSummary())
