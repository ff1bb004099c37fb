"""The one resource: where the warehouse is and how Meta is reached.

Values default to the environment of the process that runs the code (the
contract's variables), so runs launched by the daemon see what it sees. No
secret is ever configuration: the token is opened from the vault inside a sync.
"""

import dataclasses
from datetime import UTC, datetime

import dagster as dg

from rastro_assets.analytics.publish import Publisher
from rastro_assets.meta import make_client
from rastro_assets.settings import Settings
from rastro_assets.sync.syncer import Syncer
from rastro_assets.timekeeping import Clock, fixed_clock, system_clock
from rastro_assets.warehouse.connection import Warehouse


class RastroResource(dg.ConfigurableResource):
    """The DuckDB warehouse and the Meta Graph, bound from the environment."""

    duckdb_path: str | None = None
    analytics_path: str | None = None
    graph_url: str | None = None
    use_fake_graph: bool | None = None
    fixed_now: str | None = None
    """ISO 8601 instant to pin the clock at (tests and replays); unset: the system clock."""

    def settings(self) -> Settings:
        env = Settings.from_env()
        return dataclasses.replace(
            env,
            duckdb_path=self.duckdb_path or env.duckdb_path,
            analytics_path=self.analytics_path or env.analytics_path,
            graph_url=(self.graph_url or env.graph_url).rstrip("/"),
            use_fake_graph=env.use_fake_graph
            if self.use_fake_graph is None
            else self.use_fake_graph,
        )

    def clock(self) -> Clock:
        if self.fixed_now:
            return fixed_clock(datetime.fromisoformat(self.fixed_now))
        return system_clock

    def run_started_at(self, context: dg.OpExecutionContext | dg.AssetExecutionContext) -> datetime:
        """The run's start: the one `synced_at` for every row the run writes.

        With a pinned clock, the pinned instant, so a replay stamps what it claims.
        """
        if self.fixed_now:
            return self.clock()()
        record = context.instance.get_run_record_by_id(context.run_id)
        started = record.start_time if record else None
        if started is None:
            return datetime.now(UTC)
        return datetime.fromtimestamp(started, UTC)

    def warehouse(self) -> Warehouse:
        return _warehouse(self.settings())

    def publisher(self) -> Publisher:
        """Publishes the analytics snapshot; the debounce runs on real time, the accounts'
        status on the resource's clock."""
        settings = self.settings()
        return Publisher.from_settings(settings, _warehouse(settings), self.clock())

    def syncer(self) -> Syncer:
        settings = self.settings()
        return Syncer(
            _warehouse(settings),
            lambda token: make_client(settings, token),
            clock=self.clock(),
        )


def _warehouse(settings: Settings) -> Warehouse:
    # Its lock error sends analysts to the settings' snapshot, the resource's override included.
    return Warehouse(settings.duckdb_path, snapshot_path=settings.snapshot_path)
