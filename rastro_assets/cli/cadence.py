"""The cadence (CLI layer): `rastro sync-now`, `rastro status` and `rastro plan`, from a shell.

All three ask the planner the sensors use (`rastro_assets.planner`), over the
same state (`planner.history.planned_accounts`), so what they print is what the
daemon does. `status` and `plan` only read: they open the warehouse read-only
for as long as one query takes, and a warehouse that does not exist yet is an
empty list, not a new file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from rastro_assets import shards
from rastro_assets.account_ids import normalize_account_id
from rastro_assets.cli.check import status_check
from rastro_assets.cli.context import EXIT_OK, Context, Registrar, Subparsers, UsageError, command
from rastro_assets.cli.output import no_warehouse, say_no_warehouse, say_table
from rastro_assets.outcomes import AccountHealth
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.timekeeping import zone
from rastro_assets.warehouse import registry

NO_VALUE = "-"
MAX_ERROR_CHARS = 60
MAX_REASON_CHARS = 120
NO_ACCOUNTS = "no linked accounts yet: `rastro link SITE_ID AD_ACCOUNT_ID --connection ID`"


# sync-now -------------------------------------------------------------------


def add_sync_now(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "sync-now",
        _sync_now,
        "ask the daemon to sync an ad account at its next tick (about a minute)",
    )
    parser.add_argument("ad_account_id", metavar="AD_ACCOUNT_ID", help="act_<digits> or digits")


def _sync_now(args: argparse.Namespace, ctx: Context) -> int:
    ad_account_id = normalize_account_id(args.ad_account_id)
    warehouse = ctx.warehouse()
    if not warehouse.exists():
        # Nothing is linked in a warehouse that does not exist; do not create it.
        raise registry.RegistryError(
            f"{ad_account_id} is not linked to any site: {no_warehouse(warehouse.location)}"
        )
    now = ctx.now()
    with warehouse.connect() as con:
        registry.request_sync(con, ad_account_id, now)
        [account] = planned_accounts(con, [ad_account_id])
    owed = cadence.plan(account.state, now)
    if owed.kind == "paused":
        ctx.say(
            f"{ad_account_id}: sync requested, but the account is paused: its connection"
            f" {account.connection_id!r} has an invalid token; `rastro connect"
            f" {account.connection_id}` with a new token resumes it at once"
        )
    elif owed.is_due(now):
        ctx.say(
            f"{ad_account_id}: sync requested; the daemon starts it at its next tick:"
            f" {_plan_range(owed)}"
        )
    else:
        ctx.say(
            f"{ad_account_id}: sync requested; it starts {_relative(owed.due_at, now)}"
            f" ({owed.reason})"
        )
    return EXIT_OK


# status ---------------------------------------------------------------------


def add_status(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "status",
        _status,
        "how every linked ad account is doing: state, last and next sync, backfill, last error",
    )
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    parser.add_argument(
        "--check",
        action="store_true",
        help="for machines (cron, systemd, probes): exit 0 when nothing needs a person, 1 with"
        " one line per open incident, 2 when it cannot tell",
    )


def _status(args: argparse.Namespace, ctx: Context) -> int:
    if args.check:
        return status_check(ctx, args.json)
    now = ctx.now()
    accounts = _read_accounts(ctx)
    if accounts is None:
        return say_no_warehouse(ctx, args.json)
    entries = [(account, cadence.status(account.state, now)) for account in accounts]
    settings = ctx.settings()
    shard_count, size = settings.account_shards, settings.shard_accounts
    if warning := shards.crowded_warning(_shard_counts(accounts), shard_count, size):
        ctx.warn(warning)
    if args.json:
        sharded = _sharded(accounts, shard_count)
        _say_json(
            ctx,
            [
                {**status.to_json(account.sites), **_shard_json(account, sharded)}
                for account, status in entries
            ],
        )
        return EXIT_OK
    rows = [_status_row(account, status, now) for account, status in entries]
    header = ["ACCOUNT", "SITES", "STATE", "LAST SYNC", "NEXT SYNC", "BACKFILL", "LAST ERROR"]
    if _sharded(accounts, shard_count):
        header.append("SPEND ASSET")
        for row, (account, _) in zip(rows, entries, strict=True):
            row.append(shards.ad_spend_name(account.shard))
    say_table(ctx, header, rows)
    if not rows:
        ctx.say(NO_ACCOUNTS)
    return EXIT_OK


def _status_row(account: PlannedAccount, status: cadence.AccountStatus, now: datetime) -> list[str]:
    return [
        status.ad_account_id,
        ",".join(account.sites),
        status.state,
        _ago(status.last_sync_at, now),
        _next(status, now),
        _progress(status.backfill),
        _error_cell(account, status, now),
    ]


def _error_cell(account: PlannedAccount, status: cadence.AccountStatus, now: datetime) -> str:
    """LAST ERROR; a waiting account has none, since its error was the replaced token's, so
    the cell says what it waits on."""
    sealed_at = account.state.token_sealed_at
    if status.state == AccountHealth.WAITING and sealed_at is not None:
        return f"new token {_ago(sealed_at, now)}; no sync finished since"
    return _truncate(status.last_error, MAX_ERROR_CHARS)


# plan -----------------------------------------------------------------------


def add_plan(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "plan",
        _plan,
        "what the cadence would read for every linked ad account at an instant (default now)",
    )
    parser.add_argument(
        "--at",
        metavar="ISO8601",
        help="the instant, with its UTC offset: 2026-11-30T04:00:00-03:00 or 2026-11-30T07:00Z",
    )
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")


def _plan(args: argparse.Namespace, ctx: Context) -> int:
    at = parse_instant(args.at) if args.at is not None else ctx.now()
    accounts = _read_accounts(ctx)
    if accounts is None:
        return say_no_warehouse(ctx, args.json)
    plans = [cadence.plan(account.state, at) for account in accounts]
    if args.json:
        sharded = _sharded(accounts, ctx.settings().account_shards)
        _say_json(
            ctx,
            [
                {**owed.to_json(), **_shard_json(account, sharded)}
                for owed, account in zip(plans, accounts, strict=True)
            ],
        )
        return EXIT_OK
    rows = [
        [
            owed.ad_account_id,
            owed.kind,
            _days(owed),
            "yes" if owed.catalog else "no",
            _due(owed, at),
            # A hold's words are what a person looks for; KIND and DAYS say the read.
            _truncate(owed.rate_limit.reason if owed.rate_limit else owed.reason,
                      MAX_REASON_CHARS),
        ]
        for owed in plans
    ]
    header = ["ACCOUNT", "KIND", "DAYS (LOCAL)", "CATALOG", "DUE", "REASON"]
    say_table(ctx, header, rows)
    if not rows:
        ctx.say(NO_ACCOUNTS)
    return EXIT_OK


EARLIEST_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_AT = datetime(9999, 1, 1, tzinfo=UTC)
"""The plan reads months back and days ahead of `--at` in every account's zone: each of
those days must still be a date."""


def parse_instant(raw: str) -> datetime:
    """An ISO 8601 instant with its offset (`Z` or `±HH:MM`); UsageError otherwise.

    A time without an offset is refused rather than guessed: every account
    reads it in its own timezone, so a guess would be wrong for most of them.
    """
    text = raw.strip()
    if text[-1:] in ("z", "Z"):
        text = text[:-1] + "+00:00"
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--at {raw!r} is not an ISO 8601 instant such as 2026-11-30T04:00:00-03:00"
            " or 2026-11-30T07:00:00Z"
        ) from None
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise UsageError(
            f"--at {raw!r} has no UTC offset: add one (Z, +00:00, -03:00...), since each"
            " account reads the instant in its own timezone"
        )
    try:
        in_utc = instant.astimezone(UTC)
    except OverflowError:
        in_utc = None
    if in_utc is None or not EARLIEST_AT <= in_utc < LATEST_AT:
        raise UsageError(
            f"--at {raw!r} is out of range: give an instant from"
            f" {EARLIEST_AT:%Y-%m-%d} to before {LATEST_AT:%Y-%m-%d}"
        )
    return in_utc


# shared ---------------------------------------------------------------------


def _sharded(accounts: Sequence[PlannedAccount], shard_count: int) -> bool:
    """Whether the install has shards to show: with one, every account is in `ad_spend_daily`
    and the output stays what it always was."""
    return shard_count > 1 or any(account.shard for account in accounts)


def _shard_json(account: PlannedAccount, sharded: bool) -> dict:
    """Where the account's spend partitions live in Dagster: its shard and that shard's asset."""
    if not sharded:
        return {}
    return {"shard": account.shard, "spend_asset": shards.ad_spend_name(account.shard)}


def _shard_counts(accounts: Sequence[PlannedAccount]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for account in accounts:
        counts[account.shard] = counts.get(account.shard, 0) + 1
    return counts


def _read_accounts(ctx: Context) -> list[PlannedAccount] | None:
    """Every linked account with its state, from a short read-only session; None when the
    warehouse does not exist (never created here)."""
    warehouse = ctx.warehouse()
    if not warehouse.exists():
        return None
    with warehouse.connect(read_only=True) as con:
        return planned_accounts(con)


def _say_json(ctx: Context, entries: list[dict]) -> None:
    ctx.say(json.dumps(entries, indent=2))


def _days(owed: cadence.Plan) -> str:
    if owed.since is None or owed.until is None:
        return NO_VALUE
    days = (owed.until - owed.since).days + 1
    return f"{owed.since}..{owed.until} ({days} day{'s' if days != 1 else ''})"


def _plan_range(owed: cadence.Plan) -> str:
    return f"{owed.kind} {_days(owed)}{' + catalog' if owed.catalog else ''}"


def _due(owed: cadence.Plan, at: datetime) -> str:
    if owed.due_at is None:
        return NO_VALUE
    if owed.is_due(at):
        return "now"
    local = owed.due_at.astimezone(zone(owed.timezone))
    return f"{_relative(owed.due_at, at)} ({local:%Y-%m-%d %H:%M} local)"


def _next(status: cadence.AccountStatus, now: datetime) -> str:
    if status.state == "paused":
        return "paused"
    if status.next_sync_at is None:
        return NO_VALUE
    when = _relative(status.next_sync_at, now)
    if status.rate_limit is not None:
        return f"{when}, held by {status.rate_limit.limit or 'a rate limit'}"
    return when


def _progress(backfill: tuple[int, int] | None) -> str:
    if backfill is None:
        return NO_VALUE
    done, total = backfill
    return f"{done}/{total} days"


def _ago(instant: datetime | None, now: datetime) -> str:
    if instant is None:
        return "never"
    delta = now - instant
    if delta < timedelta(minutes=1):
        return "just now"
    return f"{_span(delta)} ago"


def _relative(instant: datetime | None, now: datetime) -> str:
    if instant is None:
        return NO_VALUE
    delta = instant - now
    if delta < timedelta(minutes=1):
        return "now"
    return f"in {_span(delta)}"


def _span(delta: timedelta) -> str:
    """A duration a person reads at a glance: `12 min`, `3 h 5 min`, `2 d 4 h`."""
    minutes = int(delta.total_seconds() // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min"


def _truncate(text: str | None, limit: int) -> str:
    if not text:
        return NO_VALUE
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


REGISTRARS: list[Registrar] = [add_sync_now, add_status, add_plan]
