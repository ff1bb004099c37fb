"""What the sandbox tests share: an analyst's folder with a planted `.tmp`, and a check that
no session still holds the pipeline's file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

KEY_TEXT = "c2VjcmV0LWtleS1ieXRlcy1ub2JvZHktc2hvdWxkLXJlYWQ="
"""What the key file beside the pipeline's file holds: no output may ever show it."""

WRITER = "import sys, duckdb; duckdb.connect(sys.argv[1]).close(); print('opened', flush=True)"


def analyst_folder(parent: Path, spill_target: Path) -> Path:
    """A fresh working directory whose `.tmp` (DuckDB's default spill directory) is a
    symlink to `spill_target`."""
    folder = parent / "nb"
    folder.mkdir()
    (folder / ".tmp").symlink_to(spill_target, target_is_directory=True)
    return folder


def assert_a_writer_opens_it_now(path: Path) -> None:
    """Another process opens `path` read-write at once: no session of this one holds it."""
    opened = subprocess.run(
        [sys.executable, "-c", WRITER, str(path)], capture_output=True, text=True, timeout=60
    )
    assert (opened.returncode, opened.stdout) == (0, "opened\n"), opened.stderr


def listing(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())
