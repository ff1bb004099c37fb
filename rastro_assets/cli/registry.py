"""The registry (CLI layer): `rastro keygen`, `site`, `connect`, `link` and `unlink`.

`connect` reads the token from stdin or a named environment variable, never
argv, and seals it with the secrets key; `link` asks Meta for the account's
timezone and currency unless both are given. A `link` of many accounts
(several ids, `--all`, `--from-file`) is `accounts.link_many`'s.
"""

from __future__ import annotations

import argparse
import getpass
import json
from datetime import UTC
from typing import TYPE_CHECKING

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.cli.cadence import NO_VALUE
from rastro_assets.cli.context import EXIT_OK, Context, Registrar, Subparsers, UsageError, command
from rastro_assets.cli.output import existing_warehouse, no_warehouse, say_no_warehouse, say_table
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.outcomes import ConnectionStatus, counted
from rastro_assets.settings import DAGSTER_HOME
from rastro_assets.shards import crowded_warning
from rastro_assets.tokens import token_problem
from rastro_assets.vault import generate_key
from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets.warehouse.engines import AnyWarehouse
from rastro_assets.warehouse.link_store import LinkResult
from rastro_assets.warehouse.registry import RegistryError

if TYPE_CHECKING:
    from rastro_assets.meta.models import AdAccount

NO_SITES = "no sites yet: `rastro site add SITE_ID --name NAME`"


# keygen ---------------------------------------------------------------------


def add_keygen(subparsers: Subparsers) -> None:
    command(
        subparsers,
        "keygen",
        _keygen,
        "print a fresh RASTRO_SECRETS_KEY (base64 of 32 random bytes)",
    )


def _keygen(args: argparse.Namespace, ctx: Context) -> int:
    ctx.say(generate_key())
    return EXIT_OK


# site -----------------------------------------------------------------------


def add_site(subparsers: Subparsers) -> None:
    site = subparsers.add_parser("site", help="manage sites", description="manage sites")
    actions = site.add_subparsers(dest="site_command", metavar="ACTION", required=True)
    add = command(actions, "add", _site_add, "add a site, or rename one")
    add.add_argument("site_id", metavar="SITE_ID")
    add.add_argument("--name", help="a human name for the site")
    listing = command(
        actions, "list", _site_list, "every site: its id, name, creation and linked accounts"
    )
    listing.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    rename = command(actions, "rename", _site_rename, "give a site a new name")
    rename.add_argument("site_id", metavar="SITE_ID")
    rename.add_argument("name", metavar="NAME")
    remove = command(
        actions, "remove", _site_remove, "remove a site that links no ad account any more"
    )
    remove.add_argument("site_id", metavar="SITE_ID")


def _site_add(args: argparse.Namespace, ctx: Context) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    name = registry.validate_site_name(args.name) if args.name is not None else None
    with ctx.warehouse().connect() as con:
        existed = site_store.site_exists(con, site_id)
        site_store.add_site(con, site_id, name, ctx.now())
    ctx.say(f"site {site_id} {'updated' if existed else 'added'}")
    return EXIT_OK


def _site_list(args: argparse.Namespace, ctx: Context) -> int:
    warehouse = existing_warehouse(ctx)
    if warehouse is None:
        return say_no_warehouse(ctx, args.json)
    with warehouse.connect(read_only=True) as con:
        sites = site_store.list_sites(con)
    if args.json:
        entries = [
            {
                "site_id": site.site_id,
                "name": site.name,
                "created_at": site.created_at.isoformat() if site.created_at else None,
                "linked_accounts": site.linked_accounts,
            }
            for site in sites
        ]
        ctx.say(json.dumps(entries, indent=2, ensure_ascii=False))
        return EXIT_OK
    if not sites:
        ctx.say(NO_SITES)
        return EXIT_OK
    rows = [
        [
            site.site_id,
            site.name or NO_VALUE,
            f"{site.created_at.astimezone(UTC):%Y-%m-%d %H:%M}" if site.created_at else NO_VALUE,
            str(site.linked_accounts),
        ]
        for site in sites
    ]
    say_table(ctx, ["SITE", "NAME", "CREATED (UTC)", "ACCOUNTS"], rows)
    return EXIT_OK


def _site_rename(args: argparse.Namespace, ctx: Context) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    if not args.name.strip():
        # The registry's own complaint about an empty name speaks of `site add --name`.
        raise UsageError("the new name is empty: give the site a name")
    name = registry.validate_site_name(args.name)
    warehouse = _warehouse_holding_site(ctx, site_id)
    with warehouse.connect() as con:
        old = site_store.rename_site(con, site_id, name)
    ctx.say(f"site {site_id} renamed: {old or '(no name)'} -> {name}")
    return EXIT_OK


def _site_remove(args: argparse.Namespace, ctx: Context) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    warehouse = _warehouse_holding_site(ctx, site_id)
    with warehouse.connect() as con:
        site_store.remove_site(con, site_id)
    ctx.say(f"site {site_id} removed")
    return EXIT_OK


def _warehouse_holding_site(ctx: Context, site_id: str) -> AnyWarehouse:
    """The warehouse, when it exists; a warehouse not there yet holds no site, and a
    refusal must leave no new file behind."""
    warehouse = existing_warehouse(ctx)
    if warehouse is None:
        raise RegistryError(
            f"unknown site {site_id!r}: no warehouse at {ctx.warehouse().location}"
            " yet (`rastro site add` creates it; RASTRO_DUCKDB_PATH names another file)"
        )
    return warehouse


# connect --------------------------------------------------------------------


def add_connect(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "connect",
        _connect,
        "store (or replace) a Meta access token, read from stdin, sealed with the secrets key",
    )
    parser.add_argument("connection_id", metavar="CONNECTION_ID")
    parser.add_argument(
        "--token-env", metavar="VAR", help="read the token from environment variable VAR"
    )
    parser.add_argument(
        "--no-verify", action="store_true", help="store the token without asking Meta about it"
    )


def _connect(args: argparse.Namespace, ctx: Context) -> int:
    connection_id = registry.validate_identifier("connection id", args.connection_id)
    token = _read_token(args, ctx)
    vault = ctx.vault()
    if not args.no_verify:
        _check_token(ctx, token)
    sealed = vault.seal(connection_id, token)
    with ctx.warehouse().connect() as con:
        before = registry.get_connection(con, connection_id)
        registry.save_connection(con, connection_id, sealed, ctx.now())
        waiting = sum(
            1 for account in registry.linked_accounts(con) if account.connection_id == connection_id
        )
    if before is None:
        ctx.say(f"connection {connection_id} saved")
    elif before.status != ConnectionStatus.ACTIVE:
        resume = "resumes" if waiting == 1 else "resume"
        ctx.say(
            f"connection {connection_id}: token replaced;"
            f" {counted(waiting, 'paused account')} {resume}"
        )
    else:
        ctx.say(f"connection {connection_id}: token replaced")
    return EXIT_OK


def _read_token(args: argparse.Namespace, ctx: Context) -> str:
    if args.token_env:
        token = (ctx.environ.get(args.token_env) or "").strip()
        if not token:
            raise UsageError(f"environment variable {args.token_env} is not set or empty")
    elif ctx.stdin.isatty():
        token = getpass.getpass("Meta access token: ").strip()
    else:
        token = ctx.stdin.read().strip()
    ctx.keep_secret(token)
    if not token:
        raise UsageError(
            "no token on stdin: pipe it in (rastro connect ID < token.txt) or use --token-env VAR"
        )
    # Checked before it is sealed or sent, with or without --no-verify: a token
    # that is not Meta's shape would fail every sync (and httpx's complaint
    # about it names the offending character).
    problem = token_problem(token)
    if problem is not None:
        raise UsageError(problem)
    return token


def _check_token(ctx: Context, token: str) -> None:
    client = ctx.meta_client(token)
    try:
        client.check_token()
    except MetaError as exc:
        if exc.kind in (ErrorKind.TOKEN, ErrorKind.PERMISSION):
            raise UsageError(f"Meta refused the token: {exc}") from None
        raise UsageError(
            f"could not check the token with Meta: {exc}; retry, or skip the check with --no-verify"
        ) from None
    finally:
        client.close()


# link / unlink --------------------------------------------------------------


def add_link(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "link",
        _link,
        "link a site to Meta ad accounts synced through a connection (one, many, or --all)",
    )
    parser.add_argument("site_id", metavar="SITE_ID")
    parser.add_argument(
        "ad_account_ids", nargs="*", metavar="AD_ACCOUNT_ID", help="act_<digits> or digits"
    )
    parser.add_argument("--connection", required=True, metavar="CONNECTION_ID")
    parser.add_argument(
        "--all", action="store_true",
        help="every account the connection's token reaches that no site links yet",
    )
    parser.add_argument(
        "--from-file", metavar="F",
        help="ids one a line (blank lines and # comments skipped; - reads stdin)",
    )
    parser.add_argument(
        "--timezone", metavar="IANA", help="the accounts' timezone (else each one's, from Meta)"
    )
    parser.add_argument(
        "--currency", metavar="ISO", help="the accounts' currency (else each one's, from Meta)"
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not ask Meta (then --timezone and --currency are required for a new account)",
    )


def _link(args: argparse.Namespace, ctx: Context) -> int:
    if len(args.ad_account_ids) == 1 and not (args.all or args.from_file):
        return _link_one(args, ctx, args.ad_account_ids[0])
    # Imported here: only a link of many accounts reads Meta's listing.
    from rastro_assets.cli.accounts import link_many

    return link_many(args, ctx)


def _link_one(args: argparse.Namespace, ctx: Context, raw_account_id: str) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    ad_account_id = normalize_account_id(raw_account_id)
    connection_id = registry.validate_identifier("connection id", args.connection)
    timezone = registry.validate_timezone(args.timezone) if args.timezone is not None else None
    currency = registry.normalize_currency(args.currency) if args.currency is not None else None
    name = None
    warehouse = _warehouse_holding_site(ctx, site_id)
    with warehouse.connect() as con:
        connection = link_store.require_site_and_connection(con, site_id, connection_id)
        known = registry.get_account(con, ad_account_id)
    if known is not None:
        # Linked already: what is stored is what the account's days mean.
        timezone = timezone or known.timezone
        currency = currency or known.currency
    if timezone is None or currency is None:
        if args.no_verify:
            raise UsageError(
                "--no-verify needs --timezone and --currency: without them they are read from Meta"
            )
        found = _read_account(ctx, connection, ad_account_id)
        timezone = timezone or registry.validate_timezone(found.timezone)
        currency = currency or registry.normalize_currency(found.currency)
        name = found.name
    settings = ctx.settings()
    shard_count = settings.account_shards
    with warehouse.connect() as con:
        linked = link_store.link_account(
            con, site_id, ad_account_id, connection_id, timezone, currency, ctx.now(), name=name,
            shards=shard_count, shard_size=settings.shard_accounts,
        )
        counts = shard_store.shard_counts(con)
    _register_partition(ctx, ad_account_id, linked.shard, shard_count)
    if warning := crowded_warning(counts, shard_count, settings.shard_accounts):
        ctx.warn(warning)
    if linked.result is LinkResult.ALREADY_LINKED:
        ctx.say(f"{site_id} is already linked to {ad_account_id}; nothing to do")
    else:
        ctx.say(f"linked {site_id} to {ad_account_id} ({timezone}, {currency}) via {connection_id}")
    return EXIT_OK


def _read_account(ctx: Context, connection: registry.Connection, ad_account_id: str) -> AdAccount:
    if connection.sealed_token is None:
        raise RegistryError(f"connection {connection.connection_id!r} has no token")
    token = ctx.open_token(connection.connection_id, connection.sealed_token)
    client = ctx.meta_client(token)
    try:
        return client.account(ad_account_id)
    except MetaError as exc:
        raise UsageError(
            f"Meta could not read {ad_account_id} through connection"
            f" {connection.connection_id!r}: {exc}; give --timezone and --currency to skip it"
        ) from None
    finally:
        client.close()


def _register_partition(ctx: Context, ad_account_id: str, shard: int, shard_count: int) -> None:
    """Add the account as a dynamic partition of the Dagster instance at DAGSTER_HOME.

    Only a convenience (the sensors add it on their next tick), so a failure
    here warns instead of undoing a link that is already committed.
    """
    if not DAGSTER_HOME.read(ctx.environ):
        return
    try:
        # Imported here: it loads Dagster, which no other command needs.
        from rastro_assets.instance.accounts import add_account_partition

        add_account_partition(ad_account_id, shard, shard_count)
    except Exception as exc:
        ctx.warn(
            f"could not add {ad_account_id} to the Dagster instance at DAGSTER_HOME"
            f" ({type(exc).__name__}: {' '.join(str(exc).split())}); the sensors will on"
            " their next tick"
        )


def add_unlink(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "unlink",
        _unlink,
        "unlink a site from an ad account (the last unlink removes the account's data)",
    )
    parser.add_argument("site_id", metavar="SITE_ID")
    parser.add_argument("ad_account_id", metavar="AD_ACCOUNT_ID")


def _unlink(args: argparse.Namespace, ctx: Context) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    ad_account_id = normalize_account_id(args.ad_account_id)
    warehouse = existing_warehouse(ctx)
    if warehouse is None:
        raise RegistryError(
            f"site {site_id!r} is not linked to {ad_account_id}:"
            f" {no_warehouse(ctx.warehouse().location)}"
        )
    with warehouse.connect() as con:
        purged = link_store.unlink_account(con, site_id, ad_account_id)
    if purged:
        ctx.say(
            f"unlinked {site_id} from {ad_account_id}; no site links it any more, so its spend,"
            " catalog, thumbnails and sync history were removed"
        )
    else:
        ctx.say(f"unlinked {site_id} from {ad_account_id}")
    return EXIT_OK


REGISTRARS: list[Registrar] = [add_keygen, add_site, add_connect, add_link, add_unlink]
