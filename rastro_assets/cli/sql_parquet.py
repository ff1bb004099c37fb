"""`rastro sql --output`: a query's result written to a Parquet file whole, or not at all,
and never over an existing file unless asked."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import duckdb
import pyarrow

from rastro_assets.analytics.frames import NO_EXTENSIONS, NO_SPILLING
from rastro_assets.cli.context import UsageError

OUTPUT_SUFFIX = ".parquet"


def output_path(raw: str, replace: bool) -> Path:
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


def write_parquet(
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

