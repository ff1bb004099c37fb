"""The `rastro` command: keys, sites, Meta connections and account links.

Each subcommand is a `Registrar` (adds its parser) plus a `Handler` (does the
work with a `Context`). A new command lives in its own module, exposes a
registrar, and is listed in `registrars()` (imported there, lazily, so that
module may import `Context` and `UsageError` from here without a cycle).

Bad input of any kind, argparse's included, ends as exactly one line on
stderr, `rastro: error: ...`, and exit code 2, before anything is written.
No token ever reaches stdout, stderr or argv: tokens come from stdin or a
named environment variable, and every error line is scrubbed of them.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NoReturn, TextIO

import duckdb

from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.settings import Settings
from rastro_assets.timekeeping import Clock, system_clock
from rastro_assets.vault import SecretsKeyError, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked
from rastro_assets.warehouse.registry import LinkResult, RegistryError

if TYPE_CHECKING:
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.meta.models import AdAccount

PROG = "rastro"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

REDACTED = "[redacted]"
# A token pasted as an argument would come back in argparse's complaint about
# it; Meta tokens are long runs of letters and digits, and no id of ours is.
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9]{32,}")


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


@dataclass
class Context:
    """What a handler may touch: the environment, the streams and the clock."""

    environ: Mapping[str, str]
    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    clock: Clock = system_clock
    secrets: list[str] = field(default_factory=list, repr=False)

    @classmethod
    def from_process(cls) -> Context:
        return cls(environ=os.environ, stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr)

    def settings(self) -> Settings:
        return Settings.from_env(dict(self.environ))

    def warehouse(self) -> Warehouse:
        return Warehouse(self.settings().duckdb_path)

    def vault(self) -> Vault:
        return Vault.from_env(self.environ)

    def now(self) -> datetime:
        return self.clock()

    def keep_secret(self, secret: str) -> None:
        """Scrub `secret` from every line this command prints from now on."""
        if secret:
            self.secrets.append(secret)

    def say(self, line: str) -> None:
        print(self.scrub(line), file=self.stdout)

    def warn(self, line: str) -> None:
        print(f"{PROG}: warning: {self.scrub(line)}", file=self.stderr)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def meta_client(self, token: str) -> MetaClient:
        # Imported here: the client pulls in httpx, which the offline commands never need.
        from rastro_assets.meta import make_client

        self.keep_secret(token)
        return make_client(self.settings(), token)


Handler = Callable[[argparse.Namespace, Context], int]
Subparsers = argparse._SubParsersAction  # argparse exposes no public name for it
Registrar = Callable[[Subparsers], None]


class _Parser(argparse.ArgumentParser):
    """Turns argparse's usage dump into one `UsageError` line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def command(subparsers: Subparsers, name: str, handler: Handler, help: str) -> _Parser:
    """Add subcommand `name`, run by `handler`; returns its parser for arguments."""
    parser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler)
    return parser


def registrars() -> list[Registrar]:
    """Every subcommand, in the order `rastro --help` lists them."""
    from rastro_assets import cli_cadence, cli_sql, cli_tools

    return [
        add_keygen,
        add_site,
        add_connect,
        add_link,
        add_unlink,
        *cli_sql.REGISTRARS,
        *cli_cadence.REGISTRARS,
        *cli_tools.REGISTRARS,
    ]


def build_parser() -> _Parser:
    parser = _Parser(
        prog=PROG, description="Meta ad spend in DuckDB: keys, sites, connections and links."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in registrars():
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script `rastro`; returns the exit code."""
    return run(argv, Context.from_process())


def run(argv: Sequence[str] | None, ctx: Context) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args, ctx)
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except (UsageError, SecretsKeyError, WarehouseLocked, RegistryError, ValueError) as exc:
        return _fail(ctx, str(exc), EXIT_USAGE)
    except MetaError as exc:
        return _fail(ctx, f"Meta: {exc}", EXIT_USAGE)
    except duckdb.Error as exc:
        return _fail(ctx, f"the warehouse failed: {exc}", EXIT_FAILED)


def _fail(ctx: Context, message: str, code: int) -> int:
    line = _TOKEN_LIKE.sub(REDACTED, " ".join(ctx.scrub(message).split()))
    print(f"{PROG}: error: {line}", file=ctx.stderr)
    return code


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


def _site_add(args: argparse.Namespace, ctx: Context) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    name = args.name.strip() if args.name else None
    with ctx.warehouse().connect() as con:
        existed = registry.site_exists(con, site_id)
        registry.add_site(con, site_id, name, ctx.now())
    ctx.say(f"site {site_id} {'updated' if existed else 'added'}")
    return EXIT_OK


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
    elif before.status != registry.ACTIVE:
        ctx.say(f"connection {connection_id}: token replaced; {waiting} paused account(s) resume")
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
    if any(char.isspace() or not char.isprintable() for char in token):
        raise UsageError("the token has spaces, line breaks or control characters inside it")
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
        "link a site to a Meta ad account synced through a connection",
    )
    parser.add_argument("site_id", metavar="SITE_ID")
    parser.add_argument("ad_account_id", metavar="AD_ACCOUNT_ID", help="act_<digits> or digits")
    parser.add_argument("--connection", required=True, metavar="CONNECTION_ID")
    parser.add_argument("--timezone", metavar="IANA", help="the account's timezone (else Meta's)")
    parser.add_argument("--currency", metavar="ISO", help="the account's currency (else Meta's)")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not ask Meta (then --timezone and --currency are required for a new account)",
    )


def _link(args: argparse.Namespace, ctx: Context) -> int:
    site_id = registry.validate_identifier("site id", args.site_id)
    ad_account_id = registry.normalize_account_id(args.ad_account_id)
    connection_id = registry.validate_identifier("connection id", args.connection)
    timezone = registry.validate_timezone(args.timezone) if args.timezone is not None else None
    currency = registry.normalize_currency(args.currency) if args.currency is not None else None
    name = None
    warehouse = ctx.warehouse()
    with warehouse.connect() as con:
        if not registry.site_exists(con, site_id):
            raise RegistryError(f"unknown site {site_id!r}: add it first with `rastro site add`")
        connection = registry.get_connection(con, connection_id)
        if connection is None:
            raise RegistryError(
                f"unknown connection {connection_id!r}: connect it first with `rastro connect`"
            )
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
    with warehouse.connect() as con:
        result = registry.link_account(
            con, site_id, ad_account_id, connection_id, timezone, currency, ctx.now(), name=name
        )
    _register_partition(ctx, ad_account_id)
    if result is LinkResult.ALREADY_LINKED:
        ctx.say(f"{site_id} is already linked to {ad_account_id}; nothing to do")
    else:
        ctx.say(f"linked {site_id} to {ad_account_id} ({timezone}, {currency}) via {connection_id}")
    return EXIT_OK


def _read_account(ctx: Context, connection: registry.Connection, ad_account_id: str) -> AdAccount:
    if connection.sealed_token is None:
        raise RegistryError(f"connection {connection.connection_id!r} has no token")
    token = ctx.vault().open(connection.connection_id, connection.sealed_token)
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


def _register_partition(ctx: Context, ad_account_id: str) -> None:
    """Add the account as a dynamic partition of the Dagster instance at DAGSTER_HOME.

    Only a convenience (the sensors add it on their next tick), so a failure
    here warns instead of undoing a link that is already committed.
    """
    if not ctx.environ.get("DAGSTER_HOME"):
        return
    try:
        import dagster as dg

        from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME

        with dg.DagsterInstance.get() as instance:
            instance.add_dynamic_partitions(ACCOUNT_PARTITIONS_NAME, [ad_account_id])
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
    ad_account_id = registry.normalize_account_id(args.ad_account_id)
    with ctx.warehouse().connect() as con:
        purged = registry.unlink_account(con, site_id, ad_account_id)
    if purged:
        ctx.say(
            f"unlinked {site_id} from {ad_account_id}; no site links it any more, so its spend,"
            " catalog, thumbnails and sync history were removed"
        )
    else:
        ctx.say(f"unlinked {site_id} from {ad_account_id}")
    return EXIT_OK
