"""The running demo's fake Graph: one loopback server in the demo's own process, which every
process of the demo reaches (the daemon's runs, `rastro` commands in its folder), named in
`data/fake-graph.json` while it serves (`demo.graph`).

One world for all of them: what `rastro demo trouble` stages there, every sync sees.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from rastro_assets.demo.graph import (
    DemoGraph,
    read_graph_file,
    remove_graph_file,
    write_graph_file,
)
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.settings import RASTRO_META_FAKE, RASTRO_META_GRAPH_URL
from rastro_fake_graph import FakeWorld, serve

GRAPH_URL_VARIABLE = RASTRO_META_GRAPH_URL.name
FAKE_VARIABLE = RASTRO_META_FAKE.name


@contextmanager
def serving(paths: DemoPaths) -> Iterator[DemoGraph]:
    """The demo world served on a free loopback port, its file written; on the way out, even
    by an exception, the server closed and the file gone (when it is still this demo's)."""
    key = secrets.token_urlsafe(32)
    server = serve(FakeWorld.demo(), "127.0.0.1", 0, control_key=key)
    graph = DemoGraph(
        url=server.base_url, control_url=server.control_url, control_key=key, pid=os.getpid()
    )
    try:
        write_graph_file(paths.graph_file, graph)
        yield graph
    finally:
        # Another demo started in the same folder since may have written its own.
        if read_graph_file(paths.graph_file) == graph:
            remove_graph_file(paths.graph_file)
        server.close()


def graph_environment(env: Mapping[str, str], graph: DemoGraph) -> dict[str, str]:
    """`env` for Dagster, reading the demo's accounts from `graph`: the operator's own Graph
    settings do not apply, as the demo's accounts exist only there."""
    chosen = {name: value for name, value in env.items() if name != FAKE_VARIABLE}
    chosen[GRAPH_URL_VARIABLE] = graph.url
    return chosen


def set_aside(environ: Mapping[str, str]) -> list[str]:
    """The operator's Graph settings the demo does not use."""
    return [name for name in (GRAPH_URL_VARIABLE, FAKE_VARIABLE) if environ.get(name)]
