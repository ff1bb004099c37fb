"""`rastro warehouse copy`: the DuckDB warehouse into a PostgreSQL database, exactly.

The source is the pipeline's file (RASTRO_DUCKDB_PATH, or found as every command finds it);
the target is a PostgreSQL URL read from an environment variable (RASTRO_WAREHOUSE_URL, or
the one `--to-env` names), or given with `--to` when it carries no password: argv is
visible to every user of the host in `ps`, so a password there is refused. The copy is one
transaction (`warehouse.copying`): it ends with every table copied and checked, or with the
target as it was. A target that holds rows is refused unless `--replace`.
"""

from __future__ import annotations

import argparse
import time
from urllib.parse import parse_qsl, urlsplit

from rastro_assets.cli.context import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    Registrar,
    Subparsers,
    UsageError,
    command,
)
from rastro_assets.outcomes import counted
from rastro_assets.settings import RASTRO_WAREHOUSE_URL
from rastro_assets.warehouse import copying
from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked
from rastro_assets.warehouse.postgres import (
    PostgresWarehouse,
    WarehouseUnreachable,
    is_postgres_url,
    redacted,
)

TARGET_SETTING = RASTRO_WAREHOUSE_URL.name
SOURCE_LOCK_WAIT_SECONDS = 5.0
"""How long the copy waits for another process to let go of the file before it refuses."""


def add_warehouse(subparsers: Subparsers) -> None:
    group = subparsers.add_parser(
        "warehouse",
        help="move the warehouse: copy the DuckDB file into PostgreSQL",
        description="move the warehouse: copy the DuckDB file into PostgreSQL",
    )
    actions = group.add_subparsers(dest="warehouse_command", metavar="ACTION", required=True)
    copy = command(
        actions,
        "copy",
        _copy,
        "copy every table of the DuckDB warehouse into an empty PostgreSQL database, in one"
        " transaction, checked table by table; stop the pipeline first",
    )
    target = copy.add_mutually_exclusive_group()
    target.add_argument(
        "--to-env",
        metavar="VAR",
        default=TARGET_SETTING,
        help=f"read the target's postgresql:// URL from environment variable VAR"
        f" (default {TARGET_SETTING})",
    )
    target.add_argument(
        "--to",
        metavar="URL",
        help="the target's postgresql:// URL, without a password (libpq reads it from"
        " PGPASSWORD or ~/.pgpass)",
    )
    copy.add_argument(
        "--replace",
        action="store_true",
        help="empty the target's tables and replace their rows (only if the copy commits)",
    )


def _copy(args: argparse.Namespace, ctx: Context) -> int:
    url = _target_url(args, ctx)
    where = redacted(url)
    source = _source(ctx)
    target = PostgresWarehouse(url)
    started = time.monotonic()
    try:
        with source.connect(read_only=True) as source_con, target.connect() as target_con:
            tallies = copying.copy_warehouse(
                source_con,
                target_con,
                replace=args.replace,
                on_table=lambda tally: ctx.say(_tally_line(tally)),
            )
    except WarehouseLocked as exc:
        who = f"{exc.holder} (PID {exc.pid})" if exc.pid is not None else "another process"
        raise UsageError(
            f"the warehouse {source.path} is in use by {who}: stop the pipeline (the daemon,"
            " the webserver, every run) before copying it, so nothing changes while it is read"
        ) from None
    except WarehouseUnreachable as exc:
        detail = str(exc).split(" cannot be reached: ", 1)[-1]
        raise UsageError(f"the target {where} cannot be reached: {detail}") from None
    except copying.TargetNotEmpty as exc:
        raise UsageError(
            f"the target {where} already holds rows ({', '.join(exc.tables)}): nothing was"
            " copied; pass --replace to empty its tables and replace them"
        ) from None
    except copying.SchemaBehind as exc:
        raise UsageError(f"cannot copy into {where}: {exc}") from None
    except copying.CopyMismatch as exc:
        return ctx.fail(f"nothing was copied into {where}: {exc}", EXIT_FAILED)
    finally:
        target.close()
    rows = sum(tally.rows for tally in tallies)
    ctx.say(
        f"copied {counted(len(tallies), 'table')} and {counted(rows, 'row')} from"
        f" {source.path} to {where} in {time.monotonic() - started:.1f} s; every table's"
        f" rows and sums are equal on both sides. Set {TARGET_SETTING} to it and start the"
        " pipeline."
    )
    return EXIT_OK


def _target_url(args: argparse.Namespace, ctx: Context) -> str:
    if args.to is not None:
        url = args.to
        if redacted(url) != url:
            raise UsageError(
                "--to carries a password, which every user of this host can read in `ps`:"
                " put the URL in an environment variable and pass --to-env VAR, or leave the"
                " password to PGPASSWORD or ~/.pgpass"
            )
        named = "--to"
    else:
        url = ctx.environ.get(args.to_env, "")
        named = args.to_env
        if not url:
            raise UsageError(
                f"{args.to_env} is not set: export the target's postgresql:// URL in it"
                " (or name another variable with --to-env VAR)"
            )
    for password in _passwords(url):
        ctx.keep_secret(password)
    if not is_postgres_url(url):
        raise UsageError(f"{named} is not a postgresql:// URL: {redacted(url)}")
    return url


def _passwords(url: str) -> list[str]:
    """The password after the user, and any `password=` query parameter libpq reads."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password] if parts.password else []
    found += [value for name, value in parse_qsl(parts.query) if name.lower() == "password"]
    return [password for password in found if password]


def _source(ctx: Context) -> Warehouse:
    settings = ctx.settings()
    path = settings.require_duckdb_path()
    source = Warehouse(
        path, lock_wait_seconds=SOURCE_LOCK_WAIT_SECONDS, snapshot_path=settings.snapshot_path
    )
    if not source.exists():
        raise UsageError(f"no warehouse at {path} to copy (RASTRO_DUCKDB_PATH names another file)")
    return source


def _tally_line(tally: copying.Tally) -> str:
    sums = "".join(f", {label} {_number(value)}" for label, value in tally.sums)
    return f"{tally.table}: {counted(tally.rows, 'row')}{sums}"


def _number(value: object) -> str:
    return "-" if value is None else str(value)


REGISTRARS: list[Registrar] = [add_warehouse]
