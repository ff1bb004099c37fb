"""What the daemon does with the incidents it finds: opens, reminds and resolves each once,
stored in the warehouse, and owes each configured channel a notice of each.

Finding an incident again changes only what it says; a notice goes out when it opens, at
most every `remind` while it stays open, and once when it clears. Notices are delivered
after the transaction that owes them, with no connection held across the network: a
channel that is down is tried again by later checks, with back-off, and never holds up a
sync. A check killed between a delivery and its record sends that notice again at the next
check (at least once, never lost).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rastro_assets.alerts.channels import Channel, DeliveryError, Message
from rastro_assets.alerts.incidents import Incident
from rastro_assets.planner.instants import span, utc
from rastro_assets.warehouse import incidents as store
from rastro_assets.warehouse.connection import Connection, transaction

OPENED, REMINDER, RESOLVED = "opened", "reminder", "resolved"
FIRST_RETRY = timedelta(minutes=1)
MAX_RETRY = timedelta(hours=1)
GIVE_UP_AFTER = timedelta(hours=24)
KEEP = timedelta(days=35)
NOTICES_PER_CHECK = 50
SENDING_BUDGET_SECONDS = 25.0
"""No notice is started after this long in one check: Dagster gives a sensor's tick a
minute, and a channel that never answers takes its whole timeout on each notice."""


@dataclass(frozen=True)
class Transition:
    event: str
    incident: store.StoredIncident


def reconcile(
    con: Connection,
    found: Sequence[Incident],
    checked_kinds: Collection[str],
    channel_ids: Sequence[str],
    now: datetime,
    remind: timedelta,
    origin: str,
    *,
    forget_other_channels: bool = True,
) -> list[Transition]:
    """Store what this check found, in one transaction, and owe each channel a notice of
    each change; what changed.

    Only incidents of `checked_kinds` can clear: a kind this check could not look at (say,
    Dagster's runs were unreadable) stays as it was. Notices owed to channels not in
    `channel_ids` are given up when `forget_other_channels`.
    """
    now = utc(now)
    transitions: list[Transition] = []
    with transaction(con):
        stored = {incident.key: incident for incident in store.open_incidents(con)}
        for incident in found:
            before = stored.pop(incident.key, None)
            transition = _store_found(con, incident, before, now, remind)
            if transition is not None:
                transitions.append(transition)
        for gone in stored.values():
            if gone.kind not in checked_kinds:
                continue
            resolved = replace(gone, resolved_at=now)
            store.update_incident(con, resolved)
            transitions.append(Transition(RESOLVED, resolved))
        for transition in transitions:
            subject, body = render(transition, now, origin)
            store.queue_notices(
                con, transition.incident, transition.event, now, channel_ids, subject, body
            )
        if forget_other_channels:
            store.abandon_unconfigured(con, channel_ids, now)
        store.record_check(con, store.DAEMON_CHECKER, now)
        store.prune(con, now, KEEP)
    return transitions


def _store_found(
    con: Connection,
    incident: Incident,
    before: store.StoredIncident | None,
    now: datetime,
    remind: timedelta,
) -> Transition | None:
    """Store an incident this check found: opened when it was not open, else seen again
    with what it says now. The transition it makes, if any (a reminder only when due)."""
    if before is None:
        opened = store.StoredIncident(
            key=incident.key,
            opened_at=now,
            kind=str(incident.kind),
            summary=incident.summary,
            detail=incident.detail,
            fix=incident.fix,
            accounts=incident.accounts,
            last_seen_at=now,
            notified_at=now,
        )
        store.insert_incident(con, opened)
        return Transition(OPENED, opened)
    due = before.notified_at is None or now - utc(before.notified_at) >= remind
    seen = replace(
        before,
        summary=incident.summary,
        detail=incident.detail,
        fix=incident.fix,
        accounts=incident.accounts,
        last_seen_at=now,
        notified_at=now if due else before.notified_at,
    )
    store.update_incident(con, seen)
    return Transition(REMINDER, seen) if due else None


def render(transition: Transition, now: datetime, origin: str) -> tuple[str, str]:
    """The notice's subject line and its text."""
    incident = transition.incident
    opened = utc(incident.opened_at)
    if transition.event == OPENED:
        head = f"OPEN: {incident.summary}"
    elif transition.event == REMINDER:
        head = f"STILL OPEN after {span(now - opened)}: {incident.summary}"
    else:
        head = f"RESOLVED after {span(now - opened)}: {incident.summary}"
    lines = [head]
    if transition.event != RESOLVED:
        if incident.detail:
            lines += ["", incident.detail]
        if incident.fix:
            lines += ["", f"What to do: {incident.fix}"]
    lines += [
        "",
        f"Incident {incident.key} on {origin}, opened {opened:%Y-%m-%d %H:%M} UTC. "
        "`rastro status --check` lists what is open.",
    ]
    return f"[rastro] {head}".splitlines()[0][:200], "\n".join(lines)


@dataclass(frozen=True)
class Attempt:
    channel: str
    """The channel's label (never its URL)."""
    subject: str
    error: str | None
    retry_at: datetime | None


def deliver(
    warehouse_connect, channels: Sequence[Channel], now: datetime
) -> list[Attempt]:
    """Try every due notice once; record each outcome. `warehouse_connect` opens a short
    read-write connection (`Warehouse.connect`)."""
    now = utc(now)
    by_id = {channel.channel_id: channel for channel in channels}
    if not by_id:
        return []
    with warehouse_connect() as con:
        due = store.due_notices(con, now, NOTICES_PER_CHECK)
    started = time.monotonic()
    outcomes: list[tuple[store.Notice, str | None, datetime | None]] = []
    attempts: list[Attempt] = []
    for notice in due:
        channel = by_id.get(notice.channel_id)
        if channel is None:
            continue
        if time.monotonic() - started > SENDING_BUDGET_SECONDS:
            break  # the rest stay due for the next check: a tick has a time limit
        try:
            channel.send(
                Message(
                    incident_key=notice.incident_key,
                    event=notice.event,
                    subject=notice.subject,
                    text=notice.body,
                )
            )
            error, retry_at = None, None
        except DeliveryError as exc:
            error = str(exc)
            retry_at = _retry_at(notice, now)
        outcomes.append((notice, error, retry_at))
        attempts.append(Attempt(channel.label, notice.subject, error, retry_at))
    if outcomes:
        with warehouse_connect() as con, transaction(con):
            for notice, error, retry_at in outcomes:
                store.record_attempt(con, notice, now, error=error, retry_at=retry_at)
    return attempts


def _retry_at(notice: store.Notice, now: datetime) -> datetime | None:
    """The next try after this failed one: a minute, doubling to an hour; None (given up)
    once the notice is a day old."""
    wait = min(FIRST_RETRY * 2 ** min(notice.attempts, 12), MAX_RETRY)
    if now + wait - utc(notice.created_at) > GIVE_UP_AFTER:
        return None
    return now + wait
