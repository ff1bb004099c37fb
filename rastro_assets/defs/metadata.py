"""Materialization metadata a person reads in the UI: figures, a table, a chart."""

from __future__ import annotations

from decimal import Decimal

import dagster as dg

from rastro_assets.sync.types import SyncOutcome

CHART_WIDTH = 24


def spend_markdown(outcome: SyncOutcome) -> str:
    """Spend per day as a markdown table with a bar, newest first."""
    if not outcome.days:
        return "_no ad-days written_"
    peak = max((summary.spend for summary in outcome.days.values()), default=Decimal(0))
    lines = ["| day | spend | ad rows | |", "|---|---:|---:|---|"]
    for day in sorted(outcome.days, reverse=True):
        summary = outcome.days[day]
        width = int(summary.spend / peak * CHART_WIDTH) if peak else 0
        lines.append(f"| {day} | {summary.spend:,.2f} | {summary.rows} | `{'█' * width}` |")
    return "\n".join(lines)


def spend_metadata(outcome: SyncOutcome) -> dict[str, dg.MetadataValue]:
    request = outcome.request
    return {
        "ad_account_id": dg.MetadataValue.text(request.ad_account_id),
        "range": dg.MetadataValue.text(f"{request.since} .. {request.until}"),
        "sync_kind": dg.MetadataValue.text(request.kind),
        "rows_written": dg.MetadataValue.int(outcome.rows_written),
        "rows_deleted": dg.MetadataValue.int(outcome.rows_deleted),
        "spend_total": dg.MetadataValue.text(str(outcome.spend_total)),
        "spend_by_day": dg.MetadataValue.md(spend_markdown(outcome)),
        "incomplete_days": dg.MetadataValue.text(
            ", ".join(day.isoformat() for day in outcome.incomplete_days) or "none"
        ),
        "api_calls": dg.MetadataValue.int(outcome.api_calls),
        "peak_usage_pct": dg.MetadataValue.float(float(outcome.usage.pct)),
    }
