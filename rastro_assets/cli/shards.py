"""`rastro shard move`: spread the accounts over the shards `RASTRO_ACCOUNT_SHARDS` declares.

Run it after raising the setting and restarting the code location (the new
shards' assets must exist). Each moved account's materialized account-days not yet
in its new shard's assets are re-recorded there, in the Dagster instance at
DAGSTER_HOME; then the warehouse stores the new shard; then the account leaves the
old shard's partitions and joins the new one's (`defs.instance.move_account` says
why in that order). A move killed at any point is finished by running it again.
"""

from __future__ import annotations

import argparse
import functools

from rastro_assets import shards
from rastro_assets.cli.context import EXIT_OK, Context, Registrar, Subparsers, UsageError, command
from rastro_assets.warehouse import registry


def add_shard(subparsers: Subparsers) -> None:
    shard = subparsers.add_parser(
        "shard", help="the accounts' Dagster shards", description="the accounts' Dagster shards"
    )
    actions = shard.add_subparsers(dest="shard_command", metavar="ACTION", required=True)
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


def _move(args: argparse.Namespace, ctx: Context) -> int:
    shard_count = ctx.settings().account_shards
    with ctx.warehouse().connect(read_only=True) as con:
        linked = {account.ad_account_id for account in registry.linked_accounts(con)}
        shard_of = {
            account: shard
            for account, shard in registry.account_shards(con, linked).items()
        }
    moves = shards.planned_moves(shard_of, shard_count)
    nothing = f"nothing to move: {len(shard_of)} accounts over {shard_count} shards"
    if not moves and (args.dry_run or not ctx.environ.get("DAGSTER_HOME")):
        ctx.say(nothing)
        return EXIT_OK
    if args.dry_run:
        for account, target in sorted(moves.items()):
            ctx.say(
                f"{account}: {shards.ad_spend_name(shard_of[account])} ->"
                f" {shards.ad_spend_name(target)}"
            )
        return EXIT_OK
    if not ctx.environ.get("DAGSTER_HOME"):
        raise UsageError(
            "set DAGSTER_HOME to the daemon's instance: the move re-records each account's"
            " materialized days there"
        )
    # Imported here: it loads Dagster, which no other command needs.
    from rastro_assets.defs.instance import (
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
                ctx.warn(f"{account}: a run or backfill is in flight; run the move again later")
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
                ctx.warn(f"{account}: a run or backfill is in flight; run the move again later")
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
            ctx.say(
                f"{account}: {shards.ad_spend_name(result.old_shard)} ->"
                f" {shards.ad_spend_name(result.new_shard)}, {result.partitions} account-days"
                f" ({result.recorded} events recorded) in {result.seconds:.2f} s"
            )
    if not moved and not skipped:
        ctx.say(nothing)
        return EXIT_OK
    ctx.say(f"moved {moved} accounts" + (f"; {skipped} left for later" if skipped else ""))
    return EXIT_OK


def _store_shard(ctx: Context, ad_account_id: str, shard: int) -> None:
    with ctx.warehouse().connect() as con:
        registry.set_account_shard(con, ad_account_id, shard)


REGISTRARS: list[Registrar] = [add_shard]
