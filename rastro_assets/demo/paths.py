"""Where the demo keeps its files: `data/` of the checkout, with the demo's secrets key, the
warehouse and Dagster's home."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KEY_FILE_NAME = "secrets.key"


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
