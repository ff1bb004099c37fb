"""The incidents the warehouse shows, asked the same way by the daemon's sensor and by
`rastro status --check`: each connection's accounts, and the snapshot."""

from __future__ import annotations

from datetime import datetime

from rastro_assets.alerts import incidents as found
from rastro_assets.alerts.incidents import Incident
from rastro_assets.planner.history import planned_accounts
from rastro_assets.settings import AlertThresholds
from rastro_assets.warehouse import incidents as store
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Connection


def warehouse_incidents(
    con: Connection, publisher, now: datetime, thresholds: AlertThresholds
) -> tuple[list[Incident], int]:
    """The incidents of the linked accounts and of the snapshot `publisher` publishes (an
    `analytics.publish.Publisher`), and how many accounts are linked."""
    accounts = planned_accounts(con)
    connections = registry.get_connections(con, {a.connection_id for a in accounts})
    incidents = found.account_incidents(
        accounts,
        now,
        thresholds,
        connection_errors={cid: (c.last_error, c.invalid_since) for cid, c in connections.items()},
    )
    state = publisher.state(con)
    oldest_change = store.first_sync_since(con, state.published_at) if state.owed else None
    if oldest_change is None and state.published_at is None:
        oldest_change = min((a.state.linked_at for a in accounts), default=None)
    snapshot = found.snapshot_incident(
        state.owed,
        state.published_at,
        oldest_change,
        str(publisher.target),
        publisher.timer(),  # publishes are stamped on the publisher's clock
        thresholds,
    )
    return incidents + ([snapshot] if snapshot else []), len(accounts)
