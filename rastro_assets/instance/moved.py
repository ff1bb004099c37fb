"""The instance plug-ins' old module paths, for a `dagster.yaml` written before they moved.

Dagster imports whatever module a `dagster.yaml` names, so an install's file may still
name `rastro_assets.defs.run_queue` or a sibling. Each old name loads the module at its new
path, with one warning saying what to write instead; nothing else changes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

PLUG_INS = ("run_queue", "run_launcher", "postgres_storage", "daemon_logs")
MOVED = {f"rastro_assets.defs.{name}": f"rastro_assets.instance.{name}" for name in PLUG_INS}


class MovedPlugInWarning(UserWarning):
    """A `dagster.yaml` names an instance plug-in by the path it had before it moved."""


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"dagster.yaml names `module: {spec.name}`, which moved: write "
            f"`module: {new}` (the old path works until then)",
            MovedPlugInWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path is already loaded: nothing to run."""


def keep_old_paths() -> None:
    """Let the old paths load (once per process, whoever asks first)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
