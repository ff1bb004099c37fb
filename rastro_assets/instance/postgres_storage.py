"""Dagster's Postgres storage, each process keeping its connection open between calls.

`dagster-postgres` opens a new connection for every storage call outside the
webserver (SQLAlchemy's `NullPool`): a TLS handshake and a new server backend for
each event a run stores, and two for each asset event (the event, then its index
rows). Those connections were most of what a stored materialization cost, both the
writing process's CPU and the server's (bench/README.md, "Postgres connections kept").

`docs/dagster.scaled.yaml` names this class as its `storage: custom`, with the same
`postgres_db` config `storage: postgres` takes. Each process (daemon, code server,
run worker) keeps one connection of one pool for all three storages; calls made at
the same moment (the daemon's threads) open more, closed when returned, as before.
A connection the server or a proxy dropped is found by a ping before use and
replaced, so a restarted Postgres costs no failed write. The webserver still swaps
in Dagster's own pool (`optimize_for_webserver`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

import sqlalchemy
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
)

from rastro_assets.defs.dagster_private import share_engine

# Connections a process keeps idle: one serves a run worker, whose calls come one at a time.
KEPT_CONNECTIONS = 1

# Every live engine of this process; a process that builds instances again and again (a code
# server's sensor ticks) adds no fork hook each time, and a dropped instance's engine leaves.
_ENGINES: weakref.WeakSet[sqlalchemy.engine.Engine] = weakref.WeakSet()


def _forget_parents_connections() -> None:
    # A forked child must not write through its parent's sockets: it opens its own.
    for engine in list(_ENGINES):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_parents_connections)


def kept_connection_engine(postgres_url: str, token_provider=None) -> sqlalchemy.engine.Engine:
    """An engine that keeps `KEPT_CONNECTIONS` open, opens more on demand without waiting
    (`max_overflow=-1`), and pings a kept connection before handing it out."""
    engine = create_pg_engine(
        postgres_url,
        token_provider,
        isolation_level="AUTOCOMMIT",
        pool_size=KEPT_CONNECTIONS,
        max_overflow=-1,
        pool_pre_ping=True,
    )
    _ENGINES.add(engine)
    return engine


class PooledPostgresStorage(DagsterPostgresStorage):
    """`storage: postgres`, but every storage call of a process reuses its connection.

    The one reach into `dagster-postgres`'s internals, each storage's engine, goes through
    `share_engine` (pinned to 0.29.*; `test_postgres_storage.py` checks it).
    """

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data=None,
        token_provider=None,
    ) -> None:
        super().__init__(postgres_url, should_autocreate_tables, inst_data, token_provider)
        engine = kept_connection_engine(postgres_url, token_provider)
        share_engine(self, engine)

    @classmethod
    def from_config_value(  # ty: ignore[invalid-method-override]
        cls, inst_data, config_value: Mapping[str, Any]
    ) -> PooledPostgresStorage:
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )
