"""Accounts (CLI layer): `rastro accounts`, and `rastro link` of many (`--all`, `--from-file`).

Both read Meta's `/me/adaccounts` once, every page, with the connection's token:
`accounts` shows it beside what is linked; a many-account `link` takes each
account's timezone and currency from it instead of one `GET /act_{id}` each.

All of Meta's answers are read before the first write, with the warehouse closed
(other processes wait while it is open), so a dead token, a missing connection or
a Meta failure is one line, exit 2, nothing written. Then the accounts link in
batches of `LINK_BATCH_ACCOUNTS`, one transaction (and one short hold of the
file) each; with DAGSTER_HOME set, each batch's accounts join their shard's
partitions in one call per shard.

A refused account (a bad id, one synced through another connection, one past the
connection's 500 links, one the token does not reach...) is one `rastro: error:`
line naming it; the others link. The exit code is 0 when every account named is
linked (or already was), 2 when any was refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.cli.context import (
    EXIT_OK,
    EXIT_USAGE,
    Context,
    Registrar,
    Subparsers,
    UsageError,
    command,
)
from rastro_assets.cli.id_file import read_ids
from rastro_assets.cli.output import say_table
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.outcomes import counted
from rastro_assets.settings import DAGSTER_HOME
from rastro_assets.shards import crowded_warning
from rastro_assets.warehouse import link_store, registry, shard_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.link_store import AccountToLink
from rastro_assets.warehouse.registry import LinkedAccount, RegistryError

if TYPE_CHECKING:
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.meta.models import AdAccount

LINK_BATCH_ACCOUNTS = 100
"""Accounts linked per transaction. Every sync and sensor waits while the CLI holds the
pipeline's file, so a batch holds it only a blink (bench/linking.py measures it); and as a
batch costs Dagster one `add_dynamic_partitions` per shard, even a connection's most links
take only a handful."""

NOT_LINKED = "-"
# Shown in place of characters that would break a table's line or reorder how it reads.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cs", "Co", "Cn", "Zl", "Zp"})
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")
REPLACEMENT = "\ufffd"


# accounts -------------------------------------------------------------------


def add_accounts(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "accounts",
        _accounts,
        "the ad accounts a connection's token reaches (Meta's /me/adaccounts), and where each"
        " is linked",
    )
    parser.add_argument("connection_id", metavar="CONNECTION_ID")
    parser.add_argument("--json", action="store_true", help="one JSON array, for scripts")


def _accounts(args: argparse.Namespace, ctx: Context) -> int:
    connection_id = registry.validate_identifier("connection id", args.connection_id)
    warehouse = ctx.warehouse()
    if not warehouse.exists():
        raise _unknown_connection(connection_id)
    with warehouse.connect(read_only=True) as con:
        connection = registry.get_connection(con, connection_id)
        if connection is None:
            raise _unknown_connection(connection_id)
        linked = {account.ad_account_id: account for account in registry.linked_accounts(con)}
    reached = sorted(reachable_accounts(ctx, connection), key=lambda a: a.ad_account_id)
    if args.json:
        ctx.say(json.dumps([_account_json(a, linked.get(a.ad_account_id)) for a in reached],
                           indent=2))
        return EXIT_OK
    if not reached:
        ctx.say(f"connection {connection_id}'s token reaches no ad account")
        return EXIT_OK
    header = ["ACCOUNT", "NAME", "CURRENCY", "TIMEZONE", "STATUS", "LINKED TO"]
    rows = [
        [
            account.ad_account_id,
            _printable(account.name or ""),
            account.currency,
            account.timezone,
            account.status_name or "",
            _linked_to(linked.get(account.ad_account_id), connection_id),
        ]
        for account in reached
    ]
    say_table(ctx, header, rows)
    return EXIT_OK


def _account_json(account: AdAccount, link: LinkedAccount | None) -> dict[str, object]:
    return {
        "ad_account_id": account.ad_account_id,
        "name": account.name,
        "currency": account.currency,
        "timezone": account.timezone,
        "status": account.status_name,
        "account_status": account.account_status,
        "sites": list(link.sites) if link else [],
        "connection_id": link.connection_id if link else None,
    }


def _linked_to(link: LinkedAccount | None, connection_id: str) -> str:
    if link is None:
        return NOT_LINKED
    sites = ",".join(link.sites)
    if link.connection_id != connection_id:
        return f"{sites} (via {link.connection_id})"
    return sites


def _printable(text: str) -> str:
    """`text` with what would break its table line or reorder how it reads replaced."""
    return "".join(
        REPLACEMENT if unicodedata.category(char) in _HIDDEN_CATEGORIES or char in _BIDI
        else char
        for char in text
    )


def _unknown_connection(connection_id: str) -> RegistryError:
    return RegistryError(
        f"unknown connection {connection_id!r}: connect it first with `rastro connect`"
    )


# Meta --------------------------------------------------------------------------


@contextlib.contextmanager
def _client(ctx: Context, connection: registry.Connection) -> Iterator[MetaClient]:
    """A client holding the connection's token, opened from the vault and never printed."""
    if connection.sealed_token is None:
        raise RegistryError(f"connection {connection.connection_id!r} has no token")
    token = ctx.open_token(connection.connection_id, connection.sealed_token)
    client = ctx.meta_client(token)
    try:
        yield client
    finally:
        client.close()


def _meta_failure(connection_id: str, exc: MetaError) -> UsageError:
    if exc.kind is ErrorKind.TOKEN:
        return UsageError(
            f"Meta refused the token of connection {connection_id!r}: {exc}; connect a new"
            f" one with `rastro connect {connection_id}`"
        )
    return UsageError(
        f"Meta could not list the ad accounts connection {connection_id!r} reaches: {exc}"
    )


def reachable_accounts(ctx: Context, connection: registry.Connection) -> list[AdAccount]:
    """Every account the connection's token reaches; UsageError (one line) when Meta fails."""
    with _client(ctx, connection) as client:
        try:
            return client.reachable_accounts()
        except MetaError as exc:
            raise _meta_failure(connection.connection_id, exc) from None


# link, many at once -----------------------------------------------------------------


class _Refusals:
    """Each refused account as its one line, as it is found; remembers that one was."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.count = 0

    def __call__(self, line: str) -> None:
        self.count += 1
        self.ctx.fail(line, EXIT_USAGE)


def link_many(args: argparse.Namespace, ctx: Context) -> int:
    """`rastro link SITE_ID [AD_ACCOUNT_ID ...] [--all] [--from-file F] --connection C`."""
    site_id = registry.validate_identifier("site id", args.site_id)
    connection_id = registry.validate_identifier("connection id", args.connection)
    timezone = registry.validate_timezone(args.timezone) if args.timezone is not None else None
    currency = registry.normalize_currency(args.currency) if args.currency is not None else None
    named = _named_accounts(args, ctx)
    warehouse = ctx.warehouse()
    if not warehouse.exists():
        # No site exists in a warehouse that does not: refused without making the file.
        raise registry.RegistryError(
            f"unknown site {site_id!r}: add it first with `rastro site add` (no warehouse at"
            f" {warehouse.location} yet)"
        )
    with warehouse.connect() as con:
        connection = link_store.require_site_and_connection(con, site_id, connection_id)
        linked = {account.ad_account_id: account for account in registry.linked_accounts(con)}

    refuse = _Refusals(ctx)
    wanted: dict[str, None] = {}
    for raw in named:
        try:
            wanted[normalize_account_id(raw)] = None
        except ValueError as exc:
            refuse(str(exc))
    needs_meta = [act for act in wanted if act not in linked and (timezone is None or
                                                                    currency is None)]
    if needs_meta and args.no_verify:
        raise UsageError(
            "--no-verify needs --timezone and --currency: without them they are read from Meta"
        )
    read: dict[str, AdAccount] = {}
    if args.all or needs_meta:
        read = _read_from_meta(ctx, connection, needs_meta, refuse)
    if args.all:
        wanted = {act: None for act in sorted(read) if act not in linked}
        if not wanted:
            ctx.say(f"nothing to link: every account connection {connection_id}'s token reaches"
                    " is linked already")
            return EXIT_OK
    accounts = _accounts_to_link(wanted, linked, read, timezone, currency)
    linked_now, already = _link_in_batches(
        ctx, warehouse, site_id, connection_id, accounts, refuse
    )
    ctx.say(f"{site_id}: {linked_now} linked, {already} already linked, {refuse.count} refused"
            f" (via {connection_id})")
    return EXIT_USAGE if refuse.count else EXIT_OK


def _named_accounts(args: argparse.Namespace, ctx: Context) -> list[str]:
    """The account ids the command names, as given (arguments, then `--from-file`);
    UsageError when they and `--all` do not go together."""
    if args.all and (args.ad_account_ids or args.from_file):
        raise UsageError("--all links every reachable account not linked yet: name no account"
                         " and no --from-file with it")
    if args.all and args.no_verify:
        raise UsageError("--all asks Meta which accounts the token reaches: drop --no-verify")
    named = list(args.ad_account_ids)
    if args.from_file:
        named += read_ids(ctx, args.from_file)
    if not named and not args.all:
        raise UsageError("no ad account to link: name AD_ACCOUNT_IDs, or give --all or"
                         " --from-file F")
    return named


def _accounts_to_link(
    wanted: Mapping[str, None],
    linked: Mapping[str, LinkedAccount],
    read: Mapping[str, AdAccount],
    timezone: str | None,
    currency: str | None,
) -> list[AccountToLink]:
    """Each wanted account with its timezone and currency: as the command says, else as
    stored for a linked account, else as Meta said. One Meta refused is left out."""
    accounts = []
    for act in wanted:
        known = linked.get(act)
        meta = read.get(act)
        if known is None and meta is None and (timezone is None or currency is None):
            continue  # refused while reading Meta
        accounts.append(AccountToLink(
            act,
            timezone or (known.timezone if known else meta.timezone),
            currency or (known.currency if known else meta.currency),
            meta.name if meta else None,
        ))
    return accounts


def _read_from_meta(
    ctx: Context,
    connection: registry.Connection,
    needed: Sequence[str],
    refuse: Callable[[str], None],
) -> dict[str, AdAccount]:
    """What Meta says of the accounts the token reaches, and of each of `needed` it does not
    list (one `GET /act_{id}` each: a token may read an account its listing leaves out);
    each of those Meta refuses is refused. Any other Meta failure stops the command."""
    connection_id = connection.connection_id
    with _client(ctx, connection) as client:
        try:
            read = {account.ad_account_id: account for account in client.reachable_accounts()}
        except MetaError as exc:
            raise _meta_failure(connection_id, exc) from None
        for act in needed:
            if act in read:
                continue
            try:
                read[act] = client.account(act)
            except MetaError as exc:
                if exc.kind not in (ErrorKind.PERMISSION, ErrorKind.OTHER):
                    raise _meta_failure(connection_id, exc) from None
                refuse(f"{act}: connection {connection_id!r}'s token does not reach it ({exc})")
    return read


def _link_in_batches(
    ctx: Context,
    warehouse: Warehouse,
    site_id: str,
    connection_id: str,
    accounts: Sequence[AccountToLink],
    refuse: Callable[[str], None],
) -> tuple[int, int]:
    """Link `accounts` a batch at a time; (newly linked, already linked)."""
    settings = ctx.settings()
    shard_count, shard_size = settings.account_shards, settings.shard_accounts
    linked = already = 0
    counts: Mapping[int, int] = {}
    with _Partitions(ctx, shard_count) as partitions:
        for start in range(0, len(accounts), LINK_BATCH_ACCOUNTS):
            chunk = accounts[start : start + LINK_BATCH_ACCOUNTS]
            with warehouse.connect() as con:
                batch = link_store.link_accounts(
                    con, site_id, connection_id, chunk, ctx.now(), shards=shard_count,
                    shard_size=shard_size,
                )
                counts = shard_store.shard_counts(con)
            partitions.add(batch.shards)
            by_id = {account.ad_account_id: account for account in chunk}
            for act in batch.linked:
                account = by_id[act]
                ctx.say(f"linked {site_id} to {act} ({account.timezone}, {account.currency})"
                        f" via {connection_id}")
            for act in batch.already_linked:
                ctx.say(f"{site_id} is already linked to {act}; nothing to do")
            for refusal in batch.refused:
                refuse(str(refusal))
            linked += len(batch.linked)
            already += len(batch.already_linked)
    if warning := crowded_warning(counts, shard_count, shard_size):
        ctx.warn(warning)
    return linked, already


class _Partitions:
    """The Dagster instance at DAGSTER_HOME, opened once for every batch, if set.

    Only a convenience (the sensors add the partitions on their next tick), so a failure
    warns once and stops trying instead of undoing links already committed.
    """

    def __init__(self, ctx: Context, shard_count: int) -> None:
        self.ctx = ctx
        self.shard_count = shard_count
        self.stack = contextlib.ExitStack()
        self.instance = None
        self.failed = not DAGSTER_HOME.read(ctx.environ)

    def __enter__(self) -> _Partitions:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stack.close()

    def add(self, shard_of: Mapping[str, int]) -> None:
        if self.failed or not shard_of:
            return
        try:
            # Imported here: it loads Dagster, which no other command needs.
            from rastro_assets.instance.accounts import add_account_partitions, instance_at_home

            if self.instance is None:
                self.instance = self.stack.enter_context(instance_at_home())
            add_account_partitions(self.instance, shard_of, self.shard_count)
        except Exception as exc:
            self.failed = True
            self.ctx.warn(
                f"could not add {counted(len(shard_of), 'account')} to the Dagster instance at"
                f" DAGSTER_HOME ({type(exc).__name__}: {' '.join(str(exc).split())}); the"
                " sensors will on their next tick"
            )


REGISTRARS: list[Registrar] = [add_accounts]
