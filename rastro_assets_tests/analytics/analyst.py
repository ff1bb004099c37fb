"""An analyst's session in its own process: it opens the snapshot once and keeps it open.

Run as `python analyst.py PATH read_only|read_write`; it prints `ready` once
connected, then answers each SQL line on stdin with one JSON line (the rows,
or `{"error": ...}`) until stdin closes. DuckDB shares one database per path
inside a process, so a session that must outlive a republish is a process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb


class Analyst:
    """The test's handle on an analyst process."""

    def __init__(self, path: Path, *, read_only: bool = True) -> None:
        mode = "read_only" if read_only else "read_write"
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(path), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the analyst could not open {path}: {ready}")

    def query(self, sql: str) -> list:
        self.process.stdin.write(sql.replace("\n", " ") + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        if isinstance(answer, dict):
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)

    def __enter__(self) -> Analyst:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(path: str, mode: str) -> None:
    try:
        con = duckdb.connect(path, read_only=mode == "read_only")
    except duckdb.Error as exc:
        print(f"error: {exc}", flush=True)
        return
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            rows = [list(row) for row in con.execute(line).fetchall()]
            print(json.dumps(rows, default=str), flush=True)
        except duckdb.Error as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
    con.close()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
