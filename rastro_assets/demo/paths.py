"""Where the demo keeps its files: `data/` of the checkout, with the demo's secrets key, the
warehouse, Dagster's home and where its fake Graph listens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KEY_FILE_NAME = "secrets.key"
GRAPH_FILE_NAME = "fake-graph.json"


@dataclass(frozen=True)
class DemoPaths:
    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def key_file(self) -> Path:
        return self.data / KEY_FILE_NAME

    @property
    def duckdb(self) -> Path:
        return self.data / "rastro.duckdb"

    @property
    def dagster_home(self) -> Path:
        return self.data / "dagster_home"

    @property
    def graph_file(self) -> Path:
        """Where the running demo says where its fake Graph listens (`demo.graph`)."""
        return self.data / GRAPH_FILE_NAME
