"""The seal on a wave's plan: how a `meta_sync_wave` run tells the cadence's own plans from
plans typed into the Launchpad.

The planner trusts `meta_sync_runs.kind`: a good `backfill` reaching today counts as the
daily and weekly re-syncs, a `weekly` as the 28-day one. Anyone who reaches the Dagster UI
sets any run config and any tag, Dagster's own included, so neither can say who planned a
run. The sensor seals what it plans instead: an HMAC-SHA256 over every sync of the wave
(account, kind, range, catalog) and the instant it planned them, with a key derived (HKDF,
a label of its own) from `RASTRO_SECRETS_KEY`. The sensor (the code server) and the run
worker both hold that key; a UI user never sees it, and the seal in the run config tells
nothing of it. A run whose plan is unsealed or whose seal does not match records only
`manual`, or is refused.

A MAC rather than a ticket the sensor writes to the warehouse and the run consumes: the
sensor's tick then takes no write on the warehouse, no table is added, and a run needs no
second warehouse transaction to prove itself before its syncs open their leases.

Re-executing a sensor's wave from the UI copies its sealed config. The seal covers when the
wave was planned, and its kinds are honoured for `PLAN_LIFETIME` only: a replay within it
re-reads what the planner asked for moments before, and records it truly. An older plan
(a replay, or a wave the queue held back for long) still reads what it lists, but records
it as `manual` (`plan_is_stale`): its reads are real, its kinds no longer the cadence's
history, and failing a run that does no harm would only page someone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from rastro_assets.outcomes import SyncKind
from rastro_assets.planner.instants import utc
from rastro_assets.vault import derived_key

SEAL_LABEL = b"rastro/meta_sync_wave plan seal v1"
PLAN_LIFETIME = timedelta(minutes=75)
"""A fill run's hour, which a wave may wait behind for a run slot, and the wave's own 15
minutes (its lease): a sealed plan older than this records `manual`."""
CLOCK_SKEW = timedelta(minutes=2)
"""How far in the future a plan's instant may be (the sensor and the run on two hosts)."""
HAND_KIND = SyncKind.MANUAL
SEALED_FIELDS = ("ad_account_id", "kind", "since", "until", "catalog")


def _message(syncs: Sequence[Mapping], issued_at: str) -> bytes:
    plan = [[str(sync.get(name, "")) for name in SEALED_FIELDS] for sync in syncs]
    return json.dumps({"issued_at": issued_at, "syncs": plan}, separators=(",", ":")).encode()


def seal(syncs: Sequence[Mapping], issued_at: str, key: bytes | None = None) -> str:
    """The seal of the wave's `syncs` (each with `SEALED_FIELDS`) planned at `issued_at`
    (ISO 8601). The key is derived from the environment's secrets key unless given."""
    key = derived_key(SEAL_LABEL) if key is None else key
    return hmac.new(key, _message(syncs, issued_at), hashlib.sha256).hexdigest()


def seal_refusal(
    syncs: Sequence[Mapping], issued_at: str, given: str, now: datetime, key: bytes | None = None
) -> str | None:
    """Why this plan may not run, in one line; None when it may.

    A plan whose every kind is `manual` needs no seal. Any other must carry the seal of
    exactly these syncs and `issued_at`, an instant not yet to come at `now` (an older one
    than `PLAN_LIFETIME` runs, recording `manual`: `plan_is_stale`).
    """
    others = sorted({str(sync.get("kind")) for sync in syncs} - {HAND_KIND.value})
    if not others:
        return None
    kinds = ", ".join(repr(kind)[:40] for kind in others)
    if not given:
        return (
            f"kind {kinds} is the cadence's own: only the meta_cadence and meta_accounts "
            f"sensors record it; a wave launched by hand has kind {HAND_KIND.value}"
        )
    if not hmac.compare_digest(seal(syncs, issued_at, key), str(given)):
        return (
            f"kind {kinds} is the cadence's own, and this wave's seal does not match its "
            f"plan: a wave launched or edited by hand has kind {HAND_KIND.value}"
        )
    planned = utc(datetime.fromisoformat(issued_at))
    if planned > utc(now) + CLOCK_SKEW:
        return (
            f"this wave says it was planned at {planned:%Y-%m-%d %H:%M} UTC, which is still to "
            f"come: launch it again with kind {HAND_KIND.value}"
        )
    return None


def plan_is_stale(issued_at: str, now: datetime) -> bool:
    """Whether a sealed plan is older than `PLAN_LIFETIME`: its reads then record `manual`."""
    return utc(now) - utc(datetime.fromisoformat(issued_at)) > PLAN_LIFETIME
