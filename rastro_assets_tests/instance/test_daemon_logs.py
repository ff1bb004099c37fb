"""The backfill daemon's log lines summarise partition subsets instead of listing every key."""

from __future__ import annotations

import logging
from datetime import date, timedelta

import dagster as dg

from rastro_assets.instance.daemon_logs import BACKFILL_LOGGER, KeyListSummary, summarise_message
from rastro_assets.instance.run_queue import AccountRunCoordinator

ACCOUNTS = ("act_1003", "act_1001", "act_1002")
FIRST = date(2026, 9, 4)
KEYS = [f"{a}|{FIRST + timedelta(days=d)}" for d in range(90) for a in ACCOUNTS]
# As Dagster's backfill daemon writes it (asset_backfill._asset_graph_subset_to_str).
DAGSTER_LINE = "Asset partitions to request:\n" + "\n".join(
    f"- {asset}: {{{', '.join(KEYS)}}}" for asset in ("ad_spend_daily", "site_spend_daily")
)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_subset_of_270_keys_becomes_each_accounts_days():
    summary = "{270 partitions: " + ", ".join(
        f"{a} 2026-09-04..2026-12-02 (90 days)" for a in sorted(ACCOUNTS)
    )
    assert summarise_message(DAGSTER_LINE) == (
        "Asset partitions to request:\n"
        f"- ad_spend_daily: {summary}}}\n"
        f"- site_spend_daily: {summary}}}"
    )


def test_short_lists_and_other_braces_are_left_alone():
    few = "- ad_spend_daily: {act_1|2026-09-04, act_1|2026-09-05}"
    config = "config {" + ", ".join(f"'k{i}': {i}" for i in range(20)) + "}"
    assert summarise_message(few) == few
    assert summarise_message(config) == config


def test_the_run_coordinator_installs_the_filter_on_the_daemons_logger(tmp_path):
    logger = logging.getLogger(BACKFILL_LOGGER)
    for existing in [f for f in logger.filters if isinstance(f, KeyListSummary)]:
        logger.removeFilter(existing)
    coordinator = {"module": "rastro_assets.instance.run_queue", "class": "AccountRunCoordinator"}
    overrides = {"run_coordinator": coordinator}
    with dg.instance_for_test(temp_dir=str(tmp_path), overrides=overrides) as instance:
        assert isinstance(instance.run_coordinator, AccountRunCoordinator)
    AccountRunCoordinator()
    assert sum(isinstance(f, KeyListSummary) for f in logger.filters) == 1

    lines = Lines()
    logger.addHandler(lines)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        logger.info(DAGSTER_LINE)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(previous)
    [message] = lines.messages
    assert max(map(len, message.splitlines())) < 200
    assert "act_1002 2026-09-04..2026-12-02 (90 days)" in message
