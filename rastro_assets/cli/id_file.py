"""`rastro link --from-file`: a file of ad account ids (or stdin), one a line, read only as
far as one connection could link."""

from __future__ import annotations

from typing import TextIO

from rastro_assets.cli.context import Context, UsageError
from rastro_assets.warehouse.link_store import MAX_LINKS_PER_CONNECTION

# A file of ids is read only as far as a connection could link, plus room for ids linked
# already, repeated or mistyped (each refused on its own line); more is no list for one
# connection, and reading it all would let an endless file (`/dev/zero`) fill the memory.
FROM_FILE_MAX_IDS = MAX_LINKS_PER_CONNECTION + 100
FROM_FILE_MAX_LINE_CHARS = 512
FROM_FILE_MAX_CHARS = 256 * 1024


def read_ids(ctx: Context, source: str) -> list[str]:
    """The ids of file `source` (`-`: stdin), one a line; blank lines and `#` comments out.

    Read a line at a time and never past what a connection could link (`FROM_FILE_MAX_IDS`
    ids, `FROM_FILE_MAX_CHARS` in all, lines of `FROM_FILE_MAX_LINE_CHARS`), so a file that
    is endless (`/dev/zero`, a pipe) or no list of ids costs no more memory than a short
    one: UsageError, one line, before anything is linked or Meta is asked.
    """
    try:
        if source == "-":
            return _ids_in(ctx.stdin, source)
        with open(source, encoding="utf-8") as file:
            return _ids_in(file, source)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UsageError(f"cannot read --from-file {source!r}: {reason}") from None


def _ids_in(lines: TextIO, source: str) -> list[str]:
    ids: list[str] = []
    read = 0
    while line := lines.readline(FROM_FILE_MAX_LINE_CHARS + 1):
        read += len(line)
        if "\0" in line:
            raise UsageError(
                f"--from-file {source!r} is not a list of ids: it holds NUL bytes; nothing linked"
            )
        if len(line.rstrip("\r\n")) > FROM_FILE_MAX_LINE_CHARS:
            raise UsageError(
                f"--from-file {source!r} is not a list of ids: a line is longer than"
                f" {FROM_FILE_MAX_LINE_CHARS:,} characters; nothing linked"
            )
        if read > FROM_FILE_MAX_CHARS:
            raise UsageError(
                f"--from-file {source!r} is over {FROM_FILE_MAX_CHARS:,} characters: a"
                f" connection holds at most {MAX_LINKS_PER_CONNECTION} links; nothing linked"
            )
        account_id = line.split("#", 1)[0].strip()
        if account_id:
            ids.append(account_id)
        if len(ids) > FROM_FILE_MAX_IDS:
            raise UsageError(
                f"--from-file {source!r} names more than {FROM_FILE_MAX_IDS} ids: a connection"
                f" holds at most {MAX_LINKS_PER_CONNECTION} links; split the file by"
                " connection. Nothing linked"
            )
    return ids
