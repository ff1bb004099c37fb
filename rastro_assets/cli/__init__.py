"""The `rastro` command: keys, sites, Meta connections, account links, the cadence, SQL.

- `context`: what every command stands on (`Context`, `command()`,
  `UsageError`, exit codes, the parser, token scrubbing); it imports no command.
- `registry`: `keygen`, `site add|list|rename|remove`, `connect`, `link`, `unlink`.
- `accounts`: `accounts`, and `link` of many accounts at once.
- `sql`: `sql`, one read-only query on the analytics snapshot.
- `cadence`: `sync-now`, `status`, `plan`; `check`: `status --check`.
- `shards`: `shard` (`list`), `shard move`.
- `tools`: `rotate-key`, `demo`, `fake-meta`.
- `warehouse_copy`: `warehouse copy`, the DuckDB file into PostgreSQL.
- `webserver`: `webserver`; `daemon`: `daemon`; both start on the ground `private` makes.

A new command lives in the module of its group (or a new one), which exposes
its registrars in `REGISTRARS`; `registrars()` below lists every group.
`main` is the console script.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from rastro_assets.cli.context import (
    EXIT_FAILED,
    EXIT_USAGE,
    PROG,
    Context,
    Parser,
    Registrar,
    UsageError,
)
from rastro_assets.meta.errors import MetaError
from rastro_assets.settings import SettingsError, check_load_time_settings
from rastro_assets.vault import SecretsKeyError
from rastro_assets.warehouse.connection import (
    WarehouseError,
    WarehouseLocked,
    WarehouseUnreadable,
)
from rastro_assets.warehouse.postgres import WarehouseUnreachable
from rastro_assets.warehouse.registry import RegistryError

__all__ = ["Context", "build_parser", "main", "registrars", "run"]


def registrars() -> list[Registrar]:
    """Every subcommand, in the order `rastro --help` lists them."""
    # Imported here, not with this package: the commands' modules read the settings fixed
    # when the code loads, and `main` reports a bad one as one line before they are loaded.
    from rastro_assets.cli import (
        accounts,
        cadence,
        daemon,
        registry,
        shards,
        sql,
        tools,
        warehouse_copy,
        webserver,
    )

    return [
        *registry.REGISTRARS,
        *accounts.REGISTRARS,
        *sql.REGISTRARS,
        *cadence.REGISTRARS,
        *shards.REGISTRARS,
        *tools.REGISTRARS,
        *warehouse_copy.REGISTRARS,
        *webserver.REGISTRARS,
        *daemon.REGISTRARS,
    ]


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG, description="Meta ad spend in DuckDB: keys, sites, connections and links."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in registrars():
        register(subparsers)
    return parser


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""What a shell shows for a Unix tool that died writing to a closed pipe (`| head`)."""


def main(argv: Sequence[str] | None = None) -> int:
    """The console script `rastro`; returns the exit code.

    A reader that stops early (`rastro status --json | head`) closes the pipe: the
    command stops quietly, as `cat` would, with no traceback.

    Every setting the code reads when it loads is checked first, whatever the command:
    a bad one is bad input (one line, exit 2), not a traceback from deep in an import.
    """
    ctx = Context.from_process()
    try:
        check_load_time_settings()
    except SettingsError as exc:
        return ctx.fail(str(exc), EXIT_USAGE)
    try:
        code = run(argv, ctx)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit and would report the same broken pipe:
        # point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


def run(argv: Sequence[str] | None, ctx: Context) -> int:
    try:
        args = build_parser().parse_args(argv)
        code = args.handler(args, ctx)
        ctx.release_note()
        return code
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except (
        UsageError,
        SecretsKeyError,
        WarehouseLocked,
        WarehouseUnreadable,
        WarehouseUnreachable,
        RegistryError,
        ValueError,
    ) as exc:
        return ctx.fail(str(exc), EXIT_USAGE)
    except MetaError as exc:
        return ctx.fail(f"Meta: {exc}", EXIT_USAGE)
    except WarehouseError as exc:
        return ctx.fail(f"the warehouse failed: {exc}", EXIT_FAILED)
