"""The demo's fake Meta Graph as one server every process of the demo reaches (its daemon's
runs, `rastro` commands in its folder, `rastro demo trouble`): where it listens and the key
that stages trouble in it, kept in `data/fake-graph.json`, private to its owner.

The file is written by the running demo and names its process: a file left by a demo that is
gone names no live server, and is read as none.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CONTROL_HEADER = "X-Rastro-Control"
"""The header carrying `control_key` on a request that stages or takes away trouble."""


@dataclass(frozen=True)
class DemoGraph:
    """The running demo's fake Graph."""

    url: str
    """The Graph's base, version included, as `RASTRO_META_GRAPH_URL` takes it."""
    control_url: str
    """Where trouble is staged and taken away (loopback)."""
    control_key: str
    """Sent in `CONTROL_HEADER`: only the demo's owner, who can read the file, stages trouble."""
    pid: int
    """The demo process serving it."""


def write_graph_file(path: Path, graph: DemoGraph) -> None:
    """`graph` into `path`, replaced whole and private from its creation."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(asdict(graph), file)
    os.replace(partial, path)


def read_graph_file(path: Path) -> DemoGraph | None:
    """The demo's fake Graph named in `path`; None when there is no such file, it is not the
    user's own and private, or the demo that wrote it is gone."""
    try:
        stat = os.stat(path, follow_symlinks=False)
        if stat.st_uid != os.getuid() or stat.st_mode & 0o077 or not os.path.isfile(path):
            return None
        graph = DemoGraph(**json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return graph if _alive(graph.pid) else None


def remove_graph_file(path: Path) -> None:
    """The file gone, as the demo that wrote it stops."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
