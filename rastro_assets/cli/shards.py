"""Shards (CLI layer): `rastro shard`, which accounts each holds, and `shard move` to spread them.

`rastro shard` (or `shard list`) shows every shard `RASTRO_ACCOUNT_SHARDS` declares,
and any shard still holding accounts beyond them: its spend assets, its partitions and
its accounts. It only reads, and never creates a warehouse that is not there.

`shard move` spreads the accounts over the declared shards. Run it after raising the
setting and restarting the code location (the new shards' assets must exist). Each moved
account's materialized account-days not yet in its new shard's assets are re-recorded
there, in the Dagster instance at DAGSTER_HOME; then the warehouse stores the new shard;
then the account leaves the old shard's partitions and joins the new one's
(`instance.accounts.move_account` says why in that order). A move killed at any point is
finished by running it again.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence

from rastro_assets import shards
from rastro_assets.cli.context import EXIT_OK, Context, Registrar, Subparsers, UsageError, command
from rastro_assets.cli.output import existing_warehouse, say_no_warehouse, say_table
from rastro_assets.outcomes import counted
from rastro_assets.settings import DAGSTER_HOME
from rastro_assets.warehouse import registry, shard_store

ACCOUNTS_SHOWN = 10
"""Accounts a shard's line names before it says how many more; `--json` names them all."""


def add_shard(subparsers: Subparsers) -> None:
    shard = subparsers.add_parser(
        "shard",
        help="the accounts' Dagster shards: list them (the default) or move accounts",
        description="the accounts' Dagster shards; with no action, list them",
    )
    shard.set_defaults(handler=_list, json=False)
    actions = shard.add_subparsers(dest="shard_command", metavar="ACTION")
    listing = command(
        actions,
        "list",
        _list,
        "each shard's spend assets, partitions and accounts (what `rastro shard` shows)",
    )
    listing.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    move = command(
        actions,
        "move",
        _move,
        f"move accounts into the shards {shards.SHARDS_SETTING} declares, keeping every"
        " account-day's status",
    )
    move.add_argument(
        "--dry-run", action="store_true", help="print the moves without making them"
    )


def _list(args: argparse.Namespace, ctx: Context) -> int:
    settings = ctx.settings()
    warehouse = existing_warehouse(ctx)
    if warehouse is None:
        return say_no_warehouse(ctx, args.json)
    with warehouse.connect(read_only=True) as con:
        linked = registry.linked_accounts(con)
    shard_count = settings.account_shards
    held: dict[int, list[str]] = {shard: [] for shard in range(shard_count)}
    for account in linked:
        held.setdefault(account.shard, []).append(account.ad_account_id)
    counts = {shard: len(accounts) for shard, accounts in held.items() if accounts}
    if warning := shards.crowded_warning(counts, shard_count, settings.shard_accounts):
        ctx.warn(warning)
    if args.json:
        entries = [_shard_json(shard, held[shard], shard_count) for shard in sorted(held)]
        ctx.say(json.dumps(entries, indent=2))
        return EXIT_OK
    rows = [
        [
            str(shard) if shard < shard_count else f"{shard} (undeclared)",
            f"{shards.ad_spend_name(shard)}, {shards.site_spend_name(shard)}",
            shards.accounts_name(shard),
            str(len(held[shard])),
            _abbreviated(held[shard]),
        ]
        for shard in sorted(held)
    ]
    say_table(ctx, ["SHARD", "SPEND ASSETS", "PARTITIONS", "ACCOUNTS", "IDS"], rows)
    ctx.say(
        f"{counted(len(linked), 'linked account')} over"
        f" {counted(shard_count, 'shard')} ({shards.SHARDS_SETTING}={shard_count})"
    )
    moves = shards.planned_moves(shard_store.shard_of(linked), shard_count)
    if moves:
        ctx.say(
            f"{counted(len(moves), 'account')} to move to spread them evenly:"
            f" `{shards.MOVE_COMMAND} --dry-run` shows where"
        )
    return EXIT_OK


def _shard_json(shard: int, accounts: Sequence[str], shard_count: int) -> dict:
    return {
        "shard": shard,
        "declared": shard < shard_count,
        "spend_assets": [shards.ad_spend_name(shard), shards.site_spend_name(shard)],
        "partitions": shards.accounts_name(shard),
        "account_count": len(accounts),
        "accounts": list(accounts),
    }


def _abbreviated(accounts: Sequence[str]) -> str:
    if not accounts:
        return "-"
    shown = ", ".join(accounts[:ACCOUNTS_SHOWN])
    more = len(accounts) - ACCOUNTS_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _move(args: argparse.Namespace, ctx: Context) -> int:
    shard_count = ctx.settings().account_shards
    warehouse = existing_warehouse(ctx)
    if warehouse is None:
        return say_no_warehouse(ctx, as_json=False)
    with warehouse.connect(read_only=True) as con:
        shard_of = shard_store.shard_of(registry.linked_accounts(con))
    moves = shards.planned_moves(shard_of, shard_count)
    nothing = (
        f"nothing to move: {counted(len(shard_of), 'account')} over"
        f" {counted(shard_count, 'shard')}"
    )
    if not moves and (args.dry_run or not DAGSTER_HOME.read(ctx.environ)):
        ctx.say(nothing)
        return EXIT_OK
    if args.dry_run:
        for account, target in sorted(moves.items()):
            ctx.say(
                f"{account}: {shards.ad_spend_name(shard_of[account])} ->"
                f" {shards.ad_spend_name(target)}"
            )
        return EXIT_OK
    if not DAGSTER_HOME.read(ctx.environ):
        raise UsageError(
            "set DAGSTER_HOME to the daemon's instance: the move re-records each account's"
            " materialized days there"
        )
    moved, skipped = _move_in_instance(ctx, shard_of, moves, shard_count)
    if not moved and not skipped:
        ctx.say(nothing)
        return EXIT_OK
    ctx.say(
        f"moved {counted(moved, 'account')}" + (f"; {skipped} left for later" if skipped else "")
    )
    return EXIT_OK


def _move_in_instance(
    ctx: Context, shard_of: dict[str, int], moves: dict[str, int], shard_count: int
) -> tuple[int, int]:
    """In the daemon's instance, finish the moves a kill interrupted, then move each account
    of `moves`: how many accounts moved, and how many a run in flight left for later."""
    # Imported here: it loads Dagster, which no other command needs.
    from rastro_assets.instance.accounts import (
        busy,
        instance_at_home,
        move_account,
        place_account,
        shards_holding,
    )

    moved = skipped = 0
    with instance_at_home() as instance:
        in_flight = busy(instance)
        # A move killed after the warehouse stored the new shard left only the partitions
        # to switch (every day was recorded before that store): finish those first. An
        # account the sensor has not registered yet joins its shard here as it would there.
        holding = shards_holding(instance, max([shard_count, *(s + 1 for s in shard_of.values())]))
        for account, shard in sorted(shard_of.items()):
            held = holding.get(account, set())
            if account in moves or held == {shard}:
                continue
            if account in in_flight:
                _left_for_later(ctx, account)
                skipped += 1
                continue
            place_account(instance, account, shard, held)
            moved += 1
            ctx.say(
                f"{account}: now in the partitions of {shards.ad_spend_name(shard)}, where"
                " the warehouse places it (an interrupted move, finished)"
            )
        cache: dict = {}
        for account, target in sorted(moves.items()):
            if account in in_flight:
                _left_for_later(ctx, account)
                skipped += 1
                continue
            result = move_account(
                instance,
                account,
                shard_of[account],
                target,
                cache,
                store_shard=functools.partial(_store_shard, ctx, account, target),
                shard_count=shard_count,
            )
            moved += 1
            _say_moved(ctx, account, result)
    return moved, skipped


def _left_for_later(ctx: Context, account: str) -> None:
    ctx.warn(f"{account}: a run or backfill is in flight; run the move again later")


def _say_moved(ctx: Context, account: str, result) -> None:
    """What one move did; `result` is what `move_account` answers."""
    ctx.say(
        f"{account}: {shards.ad_spend_name(result.old_shard)} ->"
        f" {shards.ad_spend_name(result.new_shard)},"
        f" {counted(result.partitions, 'account-day')}"
        f" ({counted(result.recorded, 'event')} recorded) in {result.seconds:.2f} s"
    )


def _store_shard(ctx: Context, ad_account_id: str, shard: int) -> None:
    with ctx.warehouse().connect() as con:
        shard_store.set_account_shard(con, ad_account_id, shard)


REGISTRARS: list[Registrar] = [add_shard]
