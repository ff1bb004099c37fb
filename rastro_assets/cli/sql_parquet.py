"""`rastro sql --output`: a query's result written to a Parquet file whole, or not at all;
never over an existing file unless asked, and then only over a regular file of the invoking
user's; never inside the product's own directories; never past the size cap
(`RASTRO_SQL_OUTPUT_MAX_MB`)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import duckdb
import pyarrow

from rastro_assets.analytics.frames import NO_EXTENSIONS, NO_SPILLING
from rastro_assets.cli.context import UsageError
from rastro_assets.process_settings import Settings
from rastro_assets.settings import DAGSTER_HOME, RASTRO_SQL_OUTPUT_MAX_MB

OUTPUT_SUFFIX = ".parquet"
OUTPUT_MAX_MB_VARIABLE = RASTRO_SQL_OUTPUT_MAX_MB.name
MIB = 1 << 20
# The writer gets the result a slice of about this many bytes at a time, and its file's size
# is looked at before each: a result past the cap stops within a slice and a row group of it.
SLICE_BYTES = 1 << 20
# Row groups of at most an eighth of the cap (DuckDB's own would hold a whole result of
# thumbnails in memory and write nothing until its end, where no size can be looked at).
ROW_GROUP_MOST_BYTES = 64 << 20
ROW_GROUP_LEAST_BYTES = 64 << 10
# Opened only to look names up in (and to walk up from): no read permission needed.
_DIRECTORY_FLAGS = os.O_DIRECTORY | getattr(os, "O_PATH", os.O_RDONLY) | os.O_CLOEXEC

Places = Mapping[tuple[int, int], str]
"""The product's own directories, by (device, inode), each with what names it."""


def output_max_bytes(environ: Mapping[str, str]) -> int:
    """`RASTRO_SQL_OUTPUT_MAX_MB`: the largest file `--output` writes, in MiB (1024 unset)."""
    return RASTRO_SQL_OUTPUT_MAX_MB.read(environ) * MIB


def product_directories(settings: Settings, environ: Mapping[str, str]) -> Places:
    """The directories of the pipeline's file and of the snapshot, and DAGSTER_HOME: the
    product's own, where no analyst's file belongs. Each as it is now, links followed; one
    that cannot be looked at is left out (nothing is written through a path we cannot), and
    so is the pipeline's when its path is only a guess (an analyst's own `data/`)."""
    named = []
    if settings.not_found is None:
        named.append(
            (Path(settings.duckdb_path).parent, "the pipeline's directory, RASTRO_DUCKDB_PATH")
        )
    named.append(
        (Path(settings.snapshot_path).parent, "the snapshot's directory, RASTRO_ANALYTICS_PATH")
    )
    home = DAGSTER_HOME.read(environ)
    if home:
        named.append((Path(home), "Dagster's storage, DAGSTER_HOME"))
    places: dict[tuple[int, int], str] = {}
    for directory, what in named:
        try:
            info = os.stat(directory)
        except OSError:
            continue
        places.setdefault((info.st_dev, info.st_ino), f"{os.path.realpath(directory)} ({what})")
    return places


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
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if not replace:
        raise UsageError(_exists(path))
    _check_replaceable(path, info)
    return path


def _exists(path: Path) -> str:
    return f"--output {os.path.abspath(path)} already exists; add --replace to replace it"


def _check_replaceable(path: Path, info: os.stat_result) -> None:
    """UsageError unless `info` is a regular file of the invoking user's: `--replace` is for
    a file of theirs, never a link, a device, or another user's file."""
    where = os.path.abspath(path)
    if not stat.S_ISREG(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise UsageError(f"--replace replaces only a regular file of yours: {where} is {kind}")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"--replace replaces only a file of yours: {where} belongs to uid {info.st_uid}"
        )


def write_parquet(
    con: duckdb.DuckDBPyConnection,
    query: str,
    output: Path,
    *,
    replace: bool,
    max_bytes: int,
    forbidden: Places,
) -> int:
    """Write in a private staging directory beside the target, then move it in: a failure
    leaves no half-written file, and without `replace` an existing file is never touched.

    The output's directory is opened once, and refused if it is, or is inside, one of
    `forbidden` (walking up its `..`, so no symlink or bind mount hides where it is); every
    name after that is looked up in that open directory, so nothing swapped in along the
    path later changes where the file goes.

    The query's connection is sandboxed and cannot write a file, so it streams its
    result to a writer connection that runs only this module's own `COPY`, and may
    touch the staged file and nothing else. The staging directory is new and only ours,
    so no name planted in the output's directory decides what is written. The file's size
    is looked at as it grows: past `max_bytes`, the write stops and nothing is moved in.
    """
    directory = os.open(output.parent, _DIRECTORY_FLAGS)
    try:
        _refuse_inside(directory, output, forbidden)
        staging = f".{output.name}.{secrets.token_hex(6)}"
        os.mkdir(staging, 0o700, dir_fd=directory)
        try:
            staged = f"{_path_of(directory, output)}/{staging}/{output.name}"
            count = _copy(con, query, staged, output, max_bytes)
            _move_in(directory, f"{staging}/{output.name}", output, replace=replace)
        finally:
            shutil.rmtree(staging, dir_fd=directory, ignore_errors=True)
    finally:
        os.close(directory)
    return count


def _path_of(directory: int, output: Path) -> str:
    """A path that names the open `directory` itself: through /proc where there is one, so
    DuckDB opens the very directory checked; else the directory's path, resolved."""
    through_proc = f"/proc/self/fd/{directory}"
    if os.path.isdir(through_proc):
        return through_proc
    return output.parent.resolve().as_posix()


def _refuse_inside(directory: int, output: Path, forbidden: Places) -> None:
    """UsageError if the open `directory`, or any above it up to `/`, is a forbidden one."""
    current = os.dup(directory)
    try:
        while True:
            here = os.fstat(current)
            place = forbidden.get((here.st_dev, here.st_ino))
            if place is not None:
                raise UsageError(
                    f"--output {os.path.abspath(output)} is inside {place}: the product's own"
                    " files live there; write it elsewhere"
                )
            above = os.open("..", _DIRECTORY_FLAGS, dir_fd=current)
            os.close(current)
            current = above
            parent = os.fstat(current)
            if (parent.st_dev, parent.st_ino) == (here.st_dev, here.st_ino):
                return  # `/`
    finally:
        os.close(current)


class _OverTheCap(Exception):
    """The file being written is past the cap."""


def _copy(
    con: duckdb.DuckDBPyConnection, query: str, staged: str, output: Path, max_bytes: int
) -> int:
    result = pyarrow.RecordBatchReader.from_stream(con.sql(query))
    batches = pyarrow.RecordBatchReader.from_batches(
        result.schema, _watched(result, staged, max_bytes)
    )
    row_group = min(ROW_GROUP_MOST_BYTES, max(ROW_GROUP_LEAST_BYTES, max_bytes // 8))
    with duckdb.connect(config={**NO_EXTENSIONS, **NO_SPILLING}) as writer:
        writer.execute("SET allowed_directories = []")
        writer.execute("SET allowed_paths = ?", [[staged]])
        writer.execute("SET enable_external_access = false")
        writer.execute("SET lock_configuration = true")
        writer.register("result", batches)
        target = staged.replace("'", "''")
        try:
            count = writer.execute(
                f"COPY result TO '{target}' (FORMAT parquet, ROW_GROUP_SIZE_BYTES {row_group})"
            ).fetchone()[0]
        except duckdb.Error as exc:
            # The stream's exception reaches DuckDB, and comes back, as text only.
            if _OverTheCap.__name__ in str(exc) or _size(staged) > max_bytes:
                raise _over_the_cap(output, max_bytes) from None
            raise
    if _size(staged) > max_bytes:
        raise _over_the_cap(output, max_bytes)
    return count


def _watched(
    batches: pyarrow.RecordBatchReader, staged: str, max_bytes: int
) -> Iterator[pyarrow.RecordBatch]:
    """`batches` in slices of about `SLICE_BYTES`, stopping (`_OverTheCap`) as soon as the
    file written from them is past `max_bytes`."""
    for batch in batches:
        rows = batch.num_rows
        step = max(1, rows * SLICE_BYTES // max(batch.nbytes, 1))
        for start in range(0, rows, step):
            if _size(staged) > max_bytes:
                raise _OverTheCap(staged)
            yield batch.slice(start, step)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _over_the_cap(output: Path, max_bytes: int) -> UsageError:
    return UsageError(
        f"--output {os.path.abspath(output)}: the result is over {max_bytes // MIB:,} MiB"
        f" ({OUTPUT_MAX_MB_VARIABLE}); nothing written"
    )


def _move_in(directory: int, staged: str, output: Path, *, replace: bool) -> None:
    """Give `staged` the name `output`, whole, both looked up in the open `directory`.
    Without `replace`, a hard link: it fails when the name exists, even if it appeared
    since the check before the query, and a symlink there is never followed. With it,
    only over a regular file of the invoking user's, looked at again now."""
    name = output.name
    if replace:
        with contextlib.suppress(FileNotFoundError):
            _check_replaceable(output, os.stat(name, dir_fd=directory, follow_symlinks=False))
        os.replace(staged, name, src_dir_fd=directory, dst_dir_fd=directory)
        return
    try:
        os.link(staged, name, src_dir_fd=directory, dst_dir_fd=directory, follow_symlinks=False)
    except FileExistsError:
        raise UsageError(_exists(output)) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        _copy_exclusively(directory, staged, output)


def _copy_exclusively(directory: int, staged: str, output: Path) -> None:
    """For file systems without hard links: create `output` only if no file has the name,
    and remove it again if the copy fails."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(output.name, flags, 0o666, dir_fd=directory)
    except FileExistsError:
        raise UsageError(_exists(output)) from None
    try:
        source = os.open(staged, os.O_RDONLY, dir_fd=directory)
        with os.fdopen(descriptor, "wb") as target, os.fdopen(source, "rb") as origin:
            shutil.copyfileobj(origin, target)
    except BaseException:
        os.unlink(output.name, dir_fd=directory)
        raise
