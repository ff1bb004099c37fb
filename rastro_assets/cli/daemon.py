"""`rastro daemon`: `dagster-daemon run` for a workspace, on the private ground of `private`.

The command checks DAGSTER_HOME and the workspace file, seals the process (umask 077,
DAGSTER_HOME closed to others, code servers' sockets in its 0700 `tmp`), then becomes
the daemon by exec: the same process id, so a service manager's signals reach the daemon
itself, and the umask and TMPDIR pass to every code server and run worker it starts.
"""

from __future__ import annotations

import argparse
import os
import sys

from rastro_assets.cli.context import Context, Registrar, Subparsers, command
from rastro_assets.cli.private import (
    add_workspace_argument,
    dagster_home,
    seal_process,
    workspace_file,
)

# `dagster-daemon run`, started with this interpreter so the daemon is the one installed
# beside this command: the console script's function, found by the entry point Dagster's
# package declares, so no module Dagster keeps private is named here.
DAEMON_ARGV = [
    "-c",
    "import sys; from importlib.metadata import entry_points;"
    " sys.argv[0] = 'dagster-daemon';"
    " (script,) = entry_points(group='console_scripts', name='dagster-daemon');"
    " sys.exit(script.load()())",
    "run",
]


def add_daemon(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "daemon",
        _run_daemon,
        "run the Dagster daemon (sensors, run queue, backfills) private to this user,"
        " whatever the umask",
    )
    add_workspace_argument(parser)


def _run_daemon(args: argparse.Namespace, ctx: Context) -> int:
    home = dagster_home(ctx.environ)
    workspace = workspace_file(args.workspace)
    seal_process(home)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, *DAEMON_ARGV, "-w", str(workspace)]
    os.execv(sys.executable, argv)
    raise AssertionError("unreachable: exec returns only by raising")


REGISTRARS: list[Registrar] = [add_daemon]
