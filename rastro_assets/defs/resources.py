"""The one resource: where the warehouse is and how Meta is reached.

Everything comes from the environment of the process that runs the code (the contract's
variables, `Settings.from_env()`), so runs launched by the daemon see what it sees. No secret
is ever configuration: the token is opened from the vault inside a sync.
"""

from datetime import UTC, datetime

import dagster as dg

from rastro_assets.analytics.publish import Publisher
from rastro_assets.meta import make_client
from rastro_assets.process_settings import Settings
from rastro_assets.settings import check_defining_settings
from rastro_assets.sync.syncer import Syncer
from rastro_assets.timekeeping import Clock, system_clock
from rastro_assets.warehouse.engines import AnyWarehouse, open_warehouse


class RastroResource(dg.ConfigurableResource):
    """The DuckDB warehouse and the Meta Graph, bound from the environment.

    It has no config field, on purpose: a resource field is run config, which anyone who
    reaches the Dagster UI sets from the Launchpad. Where Meta is, which files are the
    warehouse and the snapshot and whether the fake Graph answers are the code location's
    environment (RASTRO_META_GRAPH_URL, RASTRO_DUCKDB_PATH or RASTRO_WAREHOUSE_URL,
    RASTRO_ANALYTICS_PATH, RASTRO_META_FAKE), and Dagster refuses a run config naming them
    before any run exists.
    The clock is not configuration either: a run stamped in another year would write that
    year into the sync history, and the planner would hold the account back until then.
    """

    def settings(self) -> Settings:
        # The code location loaded with the default of a refused shard count or partitions
        # start: every tick and run that would read or write on those guessed definitions
        # fails instead, naming the variable.
        check_defining_settings()
        return Settings.from_env()

    def clock(self) -> Clock:
        """The product's "now"; a subclass built in Python (tests, replays) may pin it."""
        return system_clock

    def run_started_at(self, context: dg.OpExecutionContext | dg.AssetExecutionContext) -> datetime:
        """The run's start: the one `synced_at` for every row the run writes."""
        record = context.instance.get_run_record_by_id(context.run_id)
        started = record.start_time if record else None
        if started is None:
            return datetime.now(UTC)
        return datetime.fromtimestamp(started, UTC)

    def warehouse(self) -> AnyWarehouse:
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


def _warehouse(settings: Settings) -> AnyWarehouse:
    return open_warehouse(settings)
