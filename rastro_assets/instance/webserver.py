"""The webserver (instance layer): Dagster's app, served on a socket `rastro webserver` bound.

What `dagster-webserver` does (dagster_webserver/cli.py): the instance at DAGSTER_HOME
tuned for a long-running server, a `WorkspaceProcessContext` over the workspace file
(which starts the code location's server), the app from
`create_app_from_workspace_process_context` with the same lifespan, run by uvicorn;
only the listener differs, handed in instead of a host and port. Dagster offers no public
way to build a workspace process context from a workspace file: `WorkspaceProcessContext`,
`WorkspaceFileTarget` and `configure_loggers` are its private names, taken from
`defs/dagster_private.py` (pinned to 1.13.*; the slow test
`rastro_assets_tests/cli/test_webserver.py` starts the whole path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import dagster as dg
import uvicorn
from dagster_webserver.app import create_app_from_workspace_process_context
from dagster_webserver.cli import (
    DEFAULT_DB_STATEMENT_TIMEOUT,
    DEFAULT_POOL_MAX_OVERFLOW,
    DEFAULT_POOL_RECYCLE,
    WEBSERVER_LOGGER_NAME,
)
from dagster_webserver.version import __version__

from rastro_assets.defs.dagster_private import (
    WorkspaceFileTarget,
    WorkspaceProcessContext,
    configure_loggers,
)
from rastro_assets.settings import DAGSTER_HOME

# dagster-webserver's defaults for the options it has and this command does not.
LIVE_DATA_POLL_RATE_MS = 2000
UVICORN_LOG_LEVEL = "warning"
CODE_SERVER_LOG_LEVEL = "info"


@contextlib.asynccontextmanager
async def _lifespan(app) -> AsyncIterator[None]:
    # dagster-webserver's workaround for uvicorn cancelling the lifespan at a stop:
    # the cancellation is the expected end, not an error to print.
    try:
        yield
    except asyncio.exceptions.CancelledError:
        logging.getLogger(WEBSERVER_LOGGER_NAME).info("The Dagster UI was shut down.")


def serve_ui(sock: socket.socket, workspace: Path, path_prefix: str, where: str) -> bool:
    """Serve the UI of the instance at DAGSTER_HOME on the listening `sock` until a stop;
    whether it started. `where` names the socket in the log line."""
    configure_loggers(formatter="colored", log_level="INFO")
    logger = logging.getLogger(WEBSERVER_LOGGER_NAME)
    try:
        instance = dg.DagsterInstance.get()
    except dg.DagsterError as exc:
        raise ValueError(
            f"the Dagster instance at {DAGSTER_HOME.raw()}: {exc}"
        ) from None
    with instance:
        instance.optimize_for_webserver(
            DEFAULT_DB_STATEMENT_TIMEOUT, DEFAULT_POOL_RECYCLE, DEFAULT_POOL_MAX_OVERFLOW
        )
        with WorkspaceProcessContext(
            instance,
            workspace_load_target=WorkspaceFileTarget(paths=[str(workspace)]),
            version=__version__,
            code_server_log_level=CODE_SERVER_LOG_LEVEL,
        ) as context:
            app = create_app_from_workspace_process_context(
                context, path_prefix, LIVE_DATA_POLL_RATE_MS, lifespan=_lifespan
            )
            server = uvicorn.Server(uvicorn.Config(app, log_level=UVICORN_LOG_LEVEL))
            logger.info(
                f"Serving dagster-webserver on unix socket {where}{path_prefix}"
                f" in process {os.getpid()}"
            )
            server.run(sockets=[sock])
            return server.started
