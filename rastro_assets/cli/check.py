"""`rastro status --check`: whether anything needs a person, for machines.

Exit 0 when nothing does, 1 with one line per open incident, 2 when it cannot tell (no
warehouse, an unreadable one, a bad setting, no Dagster instance). It asks the warehouse the
daemon's questions itself (`alerts.incidents`), so it is right when the daemon is down, and
takes from the daemon's stored incidents only what the daemon alone sees (Dagster's runs and
sensors); the daemon's last check, when it is too old, is an incident of its own. It compares
the warehouse with the instance at DAGSTER_HOME itself too: account-days stored from a
complete read that the spend assets do not show as materialized are the `unrecorded`
incident.
"""

from __future__ import annotations

import json
import os

from rastro_assets.alerts import incidents as found
from rastro_assets.alerts.channels import channels_from_env
from rastro_assets.alerts.incidents import DAEMON_KINDS, MAX_NAMED, Incident, IncidentKind
from rastro_assets.alerts.look import warehouse_incidents
from rastro_assets.analytics.publish import Publisher
from rastro_assets.cli.context import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context
from rastro_assets.outcomes import counted
from rastro_assets.settings import AlertThresholds, SettingsError
from rastro_assets.warehouse import incidents as store
from rastro_assets.warehouse.connection import WarehouseError, WarehouseLocked

EXIT_CANNOT_TELL = EXIT_USAGE
CHECK_LOCK_WAIT_SECONDS = 10.0


class CannotTell(Exception):
    """The check could not read what it needs; the message says what and where."""


def status_check(ctx: Context, as_json: bool) -> int:
    try:
        incidents, accounts = open_incidents(ctx)
    except (CannotTell, SettingsError) as exc:
        if as_json:
            ctx.say("[]")
        return ctx.fail(f"cannot tell: {exc}", EXIT_CANNOT_TELL)
    if as_json:
        ctx.say(json.dumps([incident.to_json() for incident in incidents], indent=2))
    elif incidents:
        for incident in incidents:
            ctx.say(f"{incident.key}: {incident.summary}; {incident.fix}")
    else:
        ctx.say(f"ok: {accounts} linked account{'' if accounts == 1 else 's'}, no open incidents")
    return EXIT_FAILED if incidents else EXIT_OK


def open_incidents(ctx: Context) -> tuple[list[Incident], int]:
    """Every incident open now, and how many accounts are linked."""
    thresholds = AlertThresholds.from_env(ctx.environment())
    settings = ctx.settings()
    warehouse = ctx.warehouse()
    path = warehouse.location
    if not warehouse.exists():
        raise CannotTell(f"no warehouse at {path} (RASTRO_DUCKDB_PATH names another file)")
    warehouse.lock_wait_seconds = CHECK_LOCK_WAIT_SECONDS
    now = ctx.now()
    publisher = Publisher.from_settings(settings, warehouse, ctx.clock)
    try:
        with warehouse.connect(read_only=True) as con:
            incidents, accounts = warehouse_incidents(con, publisher, now, thresholds)
            stored = store.open_incidents(con)
            last_check = store.last_check(con, store.DAEMON_CHECKER)
    except WarehouseLocked as exc:
        raise CannotTell(str(exc)) from None
    except (*WarehouseError, OSError) as exc:
        raise CannotTell(f"the warehouse at {path} cannot be read: {exc}") from None
    try:
        channels_from_env(ctx.environment())
        problem = None
    except SettingsError as exc:
        problem = str(exc)
    checks = (
        found.daemon_incident(last_check, now, thresholds),
        found.channels_incident(problem),
    )
    incidents += [item for item in checks if item is not None]
    incidents += [_from_store(item) for item in stored if item.kind in DAEMON_KINDS]
    unrecorded = _unrecorded_incident(ctx, warehouse, now)
    if unrecorded is not None:
        incidents.append(unrecorded)
    return sorted(incidents, key=lambda incident: incident.key), accounts


def _unrecorded_incident(ctx: Context, warehouse, now) -> Incident | None:
    """Account-days the warehouse holds that the instance at DAGSTER_HOME does not record."""
    home = ctx.environment().get("DAGSTER_HOME")
    if not home:
        raise CannotTell(
            "DAGSTER_HOME is not set: whether Dagster records every account-day the warehouse "
            "holds needs the daemon's instance (set DAGSTER_HOME as the daemon has it)"
        )
    if not os.path.isdir(home):
        raise CannotTell(f"DAGSTER_HOME names no directory: {os.path.abspath(home)}")
    try:
        # Imported here: it loads Dagster, which no other part of the check needs.
        from rastro_assets.instance.records import unrecorded_at

        found = unrecorded_at(home, warehouse, now)
    except WarehouseLocked as exc:
        raise CannotTell(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - any failure to read the instance: cannot tell
        raise CannotTell(
            f"the Dagster instance at {os.path.abspath(home)} cannot be read: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        ) from None
    if not found.days:
        return None
    accounts = tuple(sorted(found.days))
    named = ", ".join(f"{account} ({found.days[account]})" for account in accounts[:MAX_NAMED])
    more = f" and {len(accounts) - MAX_NAMED} more" if len(accounts) > MAX_NAMED else ""
    return Incident(
        key=str(IncidentKind.UNRECORDED),
        kind=IncidentKind.UNRECORDED,
        summary=f"{counted(found.total_days, 'account-day')} the warehouse holds from a "
        f"complete read {'is' if found.total_days == 1 else 'are'} not recorded as "
        f"materialized in Dagster, of {counted(len(accounts), 'account')}: {named}{more}",
        detail="\n".join(f"{account}: {found.days[account]}" for account in accounts),
        fix="the meta_records sensor records them from the warehouse, without reading Meta: "
        "check that it runs and its ticks succeed "
        '(docs/cadence.md, "When a run dies before recording")',
        accounts=accounts,
    )


def _from_store(stored: store.StoredIncident) -> Incident:
    return Incident(
        key=stored.key,
        kind=IncidentKind(stored.kind),
        summary=stored.summary,
        detail=stored.detail,
        fix=stored.fix,
        since=stored.opened_at,
        accounts=stored.accounts,
    )
