"""`rastro sql`: one query on the analytics snapshot, printed or written to Parquet.

The snapshot (`RASTRO_ANALYTICS_PATH`) is opened read-only, and only it: the
pipeline's own file is never touched, so a query never holds up a sync, and
a missing snapshot is an error, never a new file. Only statements that read
run (`SELECT` and its kin: `FROM`, `WITH`, `VALUES`, `SHOW`, `DESCRIBE`,
`SUMMARIZE`, `PIVOT`, `EXPLAIN`, `PRAGMA`), one per call; `INSERT`, `COPY`,
`ATTACH`, `SET`, `CALL` (`CHECKPOINT` is one) and the like are refused before
anything runs. The connection is read-only as well, and sandboxed
(`open_snapshot`), whatever the working directory holds: a query that names
any other file, a URL or an extension (`read_text`, `read_blob`, `glob`,
`read_csv` of a path, `http://`...) is refused with one line naming what it
tried.

Output, all of it exact:

- `table` (default): aligned columns for people, in terminal columns (a Japanese
  character or an emoji takes two); numbers right-aligned, NULL as `NULL`, a blob
  as `<blob: N bytes>`, a list or struct as JSON, a control character as `\\xNN`.
- `csv`: a header, then one line per row; NULL is an empty field, a blob is
  its base64, a list or struct is JSON.
- `json`: one array of objects, one object per row. Decimals (money) are
  strings, so `"12.3400"` stays exactly that; dates, times and timestamps
  are ISO 8601 (timestamps with their offset); intervals are ISO 8601
  durations; blobs are base64 strings; NaN and infinities are strings.
- `--output FILE.parquet`: the sandboxed query hands its result over as Arrow
  batches, and a second DuckDB connection, allowed to write one file in a
  private staging directory and nothing else, writes them (a decimal stays a
  decimal); it prints one line with the row count. The file appears whole or
  not at all, never over an existing file unless `--replace` says so (and then only
  over a regular file of the invoking user's), never inside the product's own
  directories, and never past `RASTRO_SQL_OUTPUT_MAX_MB` (`sql_parquet`).

The result is read whole before anything is printed, so a query that fails
half way prints nothing but its error; for large results, use `--output`.
"""

from __future__ import annotations

import argparse

import duckdb

from rastro_assets.analytics.frames import (
    NotTheSnapshot,
    SandboxUnavailable,
    SnapshotMissing,
    open_snapshot,
)
from rastro_assets.cli.context import EXIT_OK, Context, Registrar, Subparsers, UsageError, command
from rastro_assets.cli.sql_parquet import (
    output_max_bytes,
    output_path,
    product_directories,
    write_parquet,
)
from rastro_assets.cli.sql_print import FORMATS, print_result

_READING = {
    duckdb.StatementType.SELECT,
    duckdb.StatementType.EXPLAIN,
    duckdb.StatementType.PRAGMA,  # PRAGMA table_info('sites'); settings are SET, refused
    duckdb.StatementType.MULTI,  # PIVOT
}


def add_sql(subparsers: Subparsers) -> None:
    parser = command(
        subparsers,
        "sql",
        _sql,
        "run a query on the analytics snapshot (read-only; never the pipeline's own file)",
    )
    parser.add_argument(
        "query", metavar="QUERY", help="one SQL query that reads; `-` reads it from stdin"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="table (default), csv, or json (decimals as strings, blobs as base64)",
    )
    parser.add_argument(
        "--output",
        metavar="FILE.parquet",
        help="write the result to a Parquet file instead of printing it (at most"
        " RASTRO_SQL_OUTPUT_MAX_MB MiB, 1024 unset; never in the product's own directories)",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="with --output: replace the file if it exists (refused otherwise)",
    )


def _sql(args: argparse.Namespace, ctx: Context) -> int:
    query = ctx.stdin.read() if args.query == "-" else args.query
    query, kind = _one_reading_statement(query)
    output = output_path(args.output, args.replace) if args.output is not None else None
    if args.replace and output is None:
        raise UsageError("--replace is for --output FILE.parquet")
    if output is not None and args.format is not None:
        raise UsageError("--format is for printed results; --output always writes Parquet")
    if output is not None and kind is not duckdb.StatementType.SELECT:
        raise UsageError("--output needs a SELECT (or FROM, WITH, VALUES...) query")
    settings = ctx.settings()
    snapshot_path = settings.require_snapshot_path()
    max_bytes = output_max_bytes(ctx.environ) if output is not None else 0
    try:
        with open_snapshot(snapshot_path, pipeline_path=settings.duckdb_path) as con:
            if output is not None:
                count = write_parquet(
                    con, query, output, replace=args.replace, max_bytes=max_bytes,
                    forbidden=product_directories(settings, ctx.environ),
                )
            else:
                result = con.execute(query)
                names = [column[0] for column in result.description or []]
                rows = result.fetchall() if names else []
    except (SnapshotMissing, NotTheSnapshot, SandboxUnavailable) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # the snapshot's directory or the output's, unreadable
        raise UsageError(f"{exc.filename or snapshot_path}: {exc.strerror}") from None
    except duckdb.PermissionException as exc:
        tried = "".join(f" {name}" for name in _places_named(query))
        raise UsageError(
            f"rastro sql reads the analytics snapshot and nothing else; refused{tried}: {exc}"
        ) from None
    except duckdb.Error as exc:
        raise UsageError(str(exc)) from None
    if output is not None:
        ctx.say(f"wrote {count} row{'s' if count != 1 else ''} to {output}")
        return EXIT_OK
    fmt = args.format or "table"
    if fmt == "table" and kind is duckdb.StatementType.EXPLAIN:
        # A plan is a drawing: print it as DuckDB drew it.
        ctx.stdout.write("".join(f"{row[-1]}\n" for row in rows))
        return EXIT_OK
    print_result(ctx, fmt, names, rows)
    return EXIT_OK


def _one_reading_statement(query: str) -> tuple[str, duckdb.StatementType]:
    """The query and its kind, if it is exactly one statement that reads; UsageError
    otherwise."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise UsageError(str(exc)) from None
    if not statements:
        raise UsageError("the query is empty")
    if len(statements) > 1:
        raise UsageError(
            f"one query at a time: this has {len(statements)} statements; run them one by one"
        )
    [statement] = statements
    if statement.type not in _READING:
        kind = statement.type.name
        raise UsageError(
            f"rastro sql only reads: {kind} statements are refused. The analytics snapshot is"
            " read-only (and replaced whole at each publish); to save a result, use --output"
            " FILE.parquet"
        )
    return query, statement.type


def _places_named(query: str) -> list[str]:
    """The query's string literals that look like a path or a URL, quoted: what a refused
    query tried to reach. DuckDB's own refusal cannot say it, since the whole local file
    system is switched off before it compares a path with anything."""
    tokens = duckdb.tokenize(query)
    ends = [start for start, _ in tokens[1:]] + [len(query)]
    places = []
    for (start, kind), end in zip(tokens, ends, strict=True):
        text = query[start:end].strip()
        if kind != duckdb.token_type.string_const or not any(c in text for c in "/\\.~:"):
            continue
        if len(text) >= 2 and text[0] == text[-1] == "'":
            text = "'" + text[1:-1].replace("''", "'") + "'"
        places.append(text)
    return places


REGISTRARS: list[Registrar] = [add_sql]
