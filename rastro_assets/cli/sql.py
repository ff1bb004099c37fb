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
  not at all, and never over an existing file unless `--replace` says so.

The result is read whole before anything is printed, so a query that fails
half way prints nothing but its error; for large results, use `--output`.
"""

from __future__ import annotations

import argparse
import base64
import csv
import errno
import io
import json
import math
import os
import shutil
import tempfile
import unicodedata
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import duckdb
import pyarrow
import wcwidth

from rastro_assets.analytics.frames import (
    NO_EXTENSIONS,
    NO_SPILLING,
    NotTheSnapshot,
    SandboxUnavailable,
    SnapshotMissing,
    open_snapshot,
)
from rastro_assets.cli.context import EXIT_OK, Context, Registrar, Subparsers, UsageError, command

FORMATS = ("table", "csv", "json")
OUTPUT_SUFFIX = ".parquet"
NULL_TEXT = "NULL"

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
        help="write the result to a Parquet file instead of printing it",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="with --output: replace the file if it exists (refused otherwise)",
    )


def _sql(args: argparse.Namespace, ctx: Context) -> int:
    query = ctx.stdin.read() if args.query == "-" else args.query
    query, kind = _one_reading_statement(query)
    output = _output_path(args.output, args.replace) if args.output is not None else None
    if args.replace and output is None:
        raise UsageError("--replace is for --output FILE.parquet")
    if output is not None and args.format is not None:
        raise UsageError("--format is for printed results; --output always writes Parquet")
    if output is not None and kind is not duckdb.StatementType.SELECT:
        raise UsageError("--output needs a SELECT (or FROM, WITH, VALUES...) query")
    settings = ctx.settings()
    snapshot_path = settings.require_snapshot_path()
    try:
        with open_snapshot(snapshot_path, pipeline_path=settings.duckdb_path) as con:
            if output is not None:
                count = _write_parquet(con, query, output, replace=args.replace)
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
    _print(ctx, fmt, names, rows)
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


def _output_path(raw: str, replace: bool) -> Path:
    path = Path(raw)
    if path.suffix.lower() != OUTPUT_SUFFIX:
        raise UsageError(
            f"--output {raw!r}: only Parquet is written, to a file named *{OUTPUT_SUFFIX};"
            " for CSV or JSON use --format and redirect stdout"
        )
    if path.is_dir():
        raise UsageError(f"--output {raw!r} is a directory")
    if not path.parent.is_dir():
        raise UsageError(f"--output {raw!r}: the directory {path.parent} does not exist")
    if os.path.lexists(path) and not replace:
        raise UsageError(_exists(path))
    return path


def _exists(path: Path) -> str:
    return f"--output {os.path.abspath(path)} already exists; add --replace to replace it"


def _write_parquet(
    con: duckdb.DuckDBPyConnection, query: str, output: Path, *, replace: bool
) -> int:
    """Write in a private staging directory beside the target, then move it in: a failure
    leaves no half-written file, and without `replace` an existing file is never touched.

    The query's connection is sandboxed and cannot write a file, so it streams its
    result to a writer connection that runs only this module's own `COPY`, and may
    touch the staged file and nothing else. The staging directory is new and only ours
    (mkdtemp), so no name planted in the output's directory decides what is written.
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent.resolve()))
    staged = (staging / output.name).as_posix()
    try:
        batches = pyarrow.RecordBatchReader.from_stream(con.sql(query))
        with duckdb.connect(config={**NO_EXTENSIONS, **NO_SPILLING}) as writer:
            writer.execute("SET allowed_directories = []")
            writer.execute("SET allowed_paths = ?", [[staged]])
            writer.execute("SET enable_external_access = false")
            writer.execute("SET lock_configuration = true")
            writer.register("result", batches)
            target = staged.replace("'", "''")
            count = writer.execute(f"COPY result TO '{target}' (FORMAT parquet)").fetchone()[0]
        _move_in(Path(staged), output, replace=replace)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def _move_in(staged: Path, output: Path, *, replace: bool) -> None:
    """Give `staged` the name `output`, whole. Without `replace`, a hard link: it fails
    when the name exists, even if it appeared since the check before the query, and a
    symlink there is never followed."""
    if replace:
        os.replace(staged, output)
        return
    try:
        os.link(staged, output, follow_symlinks=False)
    except FileExistsError:
        raise UsageError(_exists(output)) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        _copy_exclusively(staged, output)


def _copy_exclusively(staged: Path, output: Path) -> None:
    """For file systems without hard links: create `output` only if no file has the name,
    and remove it again if the copy fails."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(output, flags, 0o666)
    except FileExistsError:
        raise UsageError(_exists(output)) from None
    try:
        with os.fdopen(descriptor, "wb") as target, staged.open("rb") as source:
            shutil.copyfileobj(source, target)
    except BaseException:
        output.unlink(missing_ok=True)
        raise


# printing -------------------------------------------------------------------


def _print(ctx: Context, fmt: str, names: Sequence[str], rows: Sequence[tuple]) -> None:
    if fmt == "json":
        _print_json(ctx, names, rows)
    elif fmt == "csv":
        _print_csv(ctx, names, rows)
    else:
        _print_table(ctx, names, rows)


def _print_json(ctx: Context, names: Sequence[str], rows: Sequence[tuple]) -> None:
    keys = _unique(names)
    if not rows:
        ctx.stdout.write("[]\n")
        return
    lines = [
        json.dumps(
            {key: _jsonable(value) for key, value in zip(keys, row, strict=True)},
            ensure_ascii=False,
            allow_nan=False,
        )
        for row in rows
    ]
    ctx.stdout.write("[\n" + ",\n".join(lines) + "\n]\n")


def _print_csv(ctx: Context, names: Sequence[str], rows: Sequence[tuple]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow(["" if value is None else _text(value, blob=_base64) for value in row])
    ctx.stdout.write(buffer.getvalue())


def _print_table(ctx: Context, names: Sequence[str], rows: Sequence[tuple]) -> None:
    cells = [[_cell(value) for value in row] for row in rows]
    header = [_escape(name) for name in names]
    widths = [
        max([display_width(name)] + [display_width(row[i]) for row in cells])
        for i, name in enumerate(header)
    ]
    numeric = [
        any(_is_number(row[i]) for row in rows)
        and all(row[i] is None or _is_number(row[i]) for row in rows)
        for i in range(len(names))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            _pad(value, width, right)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(header), line(["-" * width for width in widths])]
    out.extend(line(row) for row in cells)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    ctx.stdout.write("\n".join(out) + "\n")


def display_width(text: str) -> int:
    """The columns `text` takes in a terminal, which `len` gets wrong: a Japanese, Chinese
    or Korean character takes two, as does an emoji however many code points draw it (a
    flag, a skin tone, a family joined by ZWJ, a heart with VS16), and a combining mark
    none. wcwidth's tables follow Unicode's releases and clusters; the standard library's
    `unicodedata` knows neither clusters nor the emoji newer than the interpreter.

    For text without control characters (`_escape` writes them out); with one, wcwidth
    cannot tell, and each code point counts one.
    """
    width = wcwidth.wcswidth(text)
    return width if width >= 0 else len(text)


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * (width - display_width(text))
    return fill + text if right else text + fill


def _unique(names: Sequence[str]) -> list[str]:
    """Column names as JSON keys: a repeated name gets `_1`, `_2`... as DuckDB's own tools do."""
    seen: set[str] = set()
    keys = []
    for name in names:
        key, n = name, 0
        while key in seen:
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        keys.append(key)
    return keys


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return NULL_TEXT
    return _escape(_text(value, blob=lambda raw: f"<blob: {len(raw)} bytes>"))


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(text: str) -> str:
    """`text` on one line of printable characters. A control character would break the
    line, move the cursor or restyle the terminal (an ad's name is Meta's to choose), and
    takes no column anyone can count: each is written out as `\\xNN`."""
    return "".join(
        _ESCAPES.get(char)
        or (f"\\x{ord(char):02x}" if unicodedata.category(char) == "Cc" else char)
        for char in text
    )


def _text(value: Any, *, blob) -> str:
    """One value as text, for the table and CSV."""
    if isinstance(value, bytes | bytearray | memoryview):
        return blob(bytes(value))
    if isinstance(value, list | tuple | dict):
        return json.dumps(_jsonable(value), ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    jsonable = _jsonable(value)
    return jsonable if isinstance(jsonable, str) else str(jsonable)


def _base64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _jsonable(value: Any) -> Any:
    """A value JSON can carry without losing anything."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _base64(bytes(value))
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(_jsonable(key)): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(item) for item in value]
    return str(value)


def _duration(delta: timedelta) -> str:
    """An ISO 8601 duration: `P1DT2H3M4.5S`, `-PT30M`, `PT0S`."""
    sign = "-" if delta < timedelta(0) else ""
    delta = abs(delta)
    hours, rest = divmod(delta.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = f"{delta.days}D" if delta.days else ""
    clock = ""
    if hours:
        clock += f"{hours}H"
    if minutes:
        clock += f"{minutes}M"
    if seconds or delta.microseconds or not (parts or clock):
        fraction = f".{delta.microseconds:06d}".rstrip("0") if delta.microseconds else ""
        clock += f"{seconds}{fraction}S"
    return f"{sign}P{parts}{'T' + clock if clock else ''}"


REGISTRARS: list[Registrar] = [add_sql]
