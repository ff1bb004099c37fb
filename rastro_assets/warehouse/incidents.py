"""Incidents (warehouse layer): the stored ones, the notices owed each channel, the last check.

A file made before these tables existed and opened read-only (`rastro status --check` on
an install not yet upgraded by the daemon) reads as holding none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb

from rastro_assets.warehouse import dialect

DAEMON_CHECKER = "meta_incidents"
"""The checker whose last check `rastro status --check` reads: the daemon's sensor."""


@dataclass(frozen=True)
class StoredIncident:
    key: str
    opened_at: datetime
    kind: str
    summary: str
    detail: str
    fix: str
    accounts: tuple[str, ...]
    last_seen_at: datetime
    notified_at: datetime | None
    resolved_at: datetime | None = None


@dataclass(frozen=True)
class Notice:
    """One message owed to one channel."""

    incident_key: str
    opened_at: datetime
    event: str
    created_at: datetime
    channel_id: str
    subject: str
    body: str
    attempts: int


@dataclass(frozen=True)
class ChannelTrouble:
    """A channel with notices it has refused, as the UI shows it."""

    channel_id: str
    waiting: int
    failing_since: datetime
    last_error: str


def open_incidents(con: duckdb.DuckDBPyConnection) -> list[StoredIncident]:
    """Every incident not resolved, oldest first."""
    try:
        rows = con.execute(
            """
            SELECT incident_key, opened_at, kind, summary, coalesce(detail, ''),
                   coalesce(fix, ''), accounts, last_seen_at, notified_at,
                   resolved_at
            FROM alert_incidents WHERE resolved_at IS NULL ORDER BY opened_at, incident_key
            """
        ).fetchall()
    except dialect.MissingTable:
        return []
    return [_incident(row) for row in rows]


def _incident(row: tuple) -> StoredIncident:
    return StoredIncident(
        key=row[0],
        opened_at=row[1],
        kind=row[2],
        summary=row[3],
        detail=row[4],
        fix=row[5],
        accounts=tuple(row[6] or ()),
        last_seen_at=row[7],
        notified_at=row[8],
        resolved_at=row[9],
    )


def insert_incident(con: duckdb.DuckDBPyConnection, incident: StoredIncident) -> None:
    con.execute(
        """
        INSERT INTO alert_incidents (incident_key, opened_at, kind, summary, detail, fix,
            accounts, last_seen_at, notified_at, resolved_at)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)
        """,
        [
            incident.key,
            incident.opened_at,
            incident.kind,
            incident.summary,
            incident.detail,
            incident.fix,
            list(incident.accounts),
            incident.last_seen_at,
            incident.notified_at,
        ],
    )


def update_incident(con: duckdb.DuckDBPyConnection, incident: StoredIncident) -> None:
    """Store what the incident says now, when it was last seen, notified and resolved."""
    con.execute(
        """
        UPDATE alert_incidents SET summary = ?, detail = ?, fix = ?, accounts = ?,
            last_seen_at = ?, notified_at = ?, resolved_at = ?
        WHERE incident_key = ? AND opened_at = ?
        """,
        [
            incident.summary,
            incident.detail,
            incident.fix,
            list(incident.accounts),
            incident.last_seen_at,
            incident.notified_at,
            incident.resolved_at,
            incident.key,
            incident.opened_at,
        ],
    )


def queue_notices(
    con: duckdb.DuckDBPyConnection,
    incident: StoredIncident,
    event: str,
    now: datetime,
    channel_ids: Sequence[str],
    subject: str,
    body: str,
) -> None:
    for channel_id in channel_ids:
        con.execute(
            """
            INSERT INTO alert_notices (incident_key, opened_at, event, created_at, channel_id,
                subject, body, attempts, next_attempt_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)
            ON CONFLICT DO NOTHING
            """,
            [incident.key, incident.opened_at, event, now, channel_id, subject, body, now],
        )


def due_notices(con: duckdb.DuckDBPyConnection, now: datetime, limit: int) -> list[Notice]:
    """Notices neither delivered nor given up whose next try is due, oldest first."""
    rows = con.execute(
        """
        SELECT incident_key, opened_at, event, created_at, channel_id, subject, body, attempts
        FROM alert_notices
        WHERE delivered_at IS NULL AND abandoned_at IS NULL AND next_attempt_at <= ?
        ORDER BY created_at, incident_key, channel_id
        LIMIT ?
        """,
        [now, limit],
    ).fetchall()
    return [Notice(*row) for row in rows]


def record_attempt(
    con: duckdb.DuckDBPyConnection,
    notice: Notice,
    now: datetime,
    *,
    error: str | None,
    retry_at: datetime | None,
) -> None:
    """A try of `notice`: delivered when `error` is None; else tried again at `retry_at`,
    or given up when it is None."""
    con.execute(
        """
        UPDATE alert_notices SET attempts = attempts + 1, last_error = ?,
            delivered_at = CASE WHEN CAST(? AS VARCHAR) IS NULL THEN ? END,
            abandoned_at = CASE
                WHEN CAST(? AS VARCHAR) IS NOT NULL AND CAST(? AS TIMESTAMPTZ) IS NULL THEN ?
            END,
            next_attempt_at = coalesce(CAST(? AS TIMESTAMPTZ), next_attempt_at)
        WHERE incident_key = ? AND opened_at = ? AND event = ? AND created_at = ?
            AND channel_id = ?
        """,
        [
            error,
            error, now,
            error, retry_at, now,
            retry_at,
            notice.incident_key, notice.opened_at, notice.event, notice.created_at,
            notice.channel_id,
        ],
    )


def abandon_unconfigured(
    con: duckdb.DuckDBPyConnection, channel_ids: Sequence[str], now: datetime
) -> int:
    """Give up the notices of channels no longer configured; how many."""
    row = con.execute(
        """
        UPDATE alert_notices SET abandoned_at = ?,
            last_error = 'the channel is no longer configured'
        WHERE delivered_at IS NULL AND abandoned_at IS NULL
            AND NOT channel_id = ANY(?::VARCHAR[])
        """,
        [now, list(channel_ids)],
    ).fetchone()
    return int(row[0]) if row else 0


def channel_troubles(con: duckdb.DuckDBPyConnection) -> list[ChannelTrouble]:
    """Each channel with notices tried and not yet delivered: how many, since when, why."""
    try:
        rows = con.execute(
            """
            SELECT channel_id, count(*), min(created_at),
                   (array_agg(last_error ORDER BY next_attempt_at DESC)
                       FILTER (WHERE last_error IS NOT NULL))[1]
            FROM alert_notices
            WHERE delivered_at IS NULL AND abandoned_at IS NULL AND attempts > 0
            GROUP BY channel_id ORDER BY channel_id
            """
        ).fetchall()
    except dialect.MissingTable:
        return []
    return [ChannelTrouble(*row) for row in rows]


def record_check(con: duckdb.DuckDBPyConnection, checker: str, now: datetime) -> None:
    con.execute(
        """
        INSERT INTO alert_checks (checker, checked_at) VALUES (?, ?)
        ON CONFLICT (checker) DO UPDATE SET checked_at = excluded.checked_at
        """,
        [checker, now],
    )


def last_check(con: duckdb.DuckDBPyConnection, checker: str) -> datetime | None:
    try:
        row = con.execute(
            "SELECT checked_at FROM alert_checks WHERE checker = ?", [checker]
        ).fetchone()
    except dialect.MissingTable:
        return None
    return row[0] if row else None


def prune(con: duckdb.DuckDBPyConnection, now: datetime, keep: timedelta) -> None:
    """Forget resolved incidents and settled notices older than `keep`."""
    before = now - keep
    con.execute(
        "DELETE FROM alert_notices WHERE coalesce(delivered_at, abandoned_at) < ?", [before]
    )
    con.execute("DELETE FROM alert_incidents WHERE resolved_at < ?", [before])


def first_sync_since(con: duckdb.DuckDBPyConnection, instant: datetime | None) -> datetime | None:
    """When the first sync after `instant` started (any sync, when None): the oldest change
    a snapshot published at `instant` cannot carry."""
    row = con.execute(
        "SELECT min(started_at) FROM meta_sync_runs"
        " WHERE CAST(? AS TIMESTAMPTZ) IS NULL OR started_at > ?",
        [instant, instant],
    ).fetchone()
    return row[0] if row else None
