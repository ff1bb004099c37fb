"""What several commands print alike: a missing warehouse said as such, and tables."""

from __future__ import annotations

from collections.abc import Sequence

from rastro_assets.cli.context import EXIT_OK, Context
from rastro_assets.cli.sql_print import display_width
from rastro_assets.warehouse.engines import AnyWarehouse


def no_warehouse(location: str) -> str:
    return (
        f"no warehouse at {location}: nothing has been linked there yet"
        " (`rastro site add`, `rastro connect` or `rastro demo` creates it; RASTRO_DUCKDB_PATH"
        " names another file)"
    )


def existing_warehouse(ctx: Context) -> AnyWarehouse | None:
    """The pipeline's file, or None when it does not exist. Opening it, even read-only,
    would create and migrate a missing one: a command that only looks asks this first."""
    warehouse = ctx.warehouse()
    return warehouse if warehouse.exists() else None


def say_no_warehouse(ctx: Context, as_json: bool) -> int:
    """What a listing says of a warehouse that does not exist, as `rastro status` says it:
    on stdout for people; on stderr beside an empty array for scripts."""
    line = no_warehouse(ctx.warehouse().location)
    if as_json:
        ctx.warn(line)
        ctx.say("[]")
    else:
        ctx.say(line)
    return EXIT_OK


def say_table(ctx: Context, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns, measured in terminal columns: a site's name may be any script."""
    columns = zip(header, *rows, strict=True)
    widths = [max(display_width(cell) for cell in column) for column in columns]
    for cells in (header, *rows):
        ctx.say(
            "  ".join(
                cell + " " * (width - display_width(cell))
                for cell, width in zip(cells, widths, strict=True)
            ).rstrip()
        )
