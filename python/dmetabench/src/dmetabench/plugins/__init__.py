"""Benchmark plugins: classes with prepare / doBench / cleanup and a progress counter."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

from . import builtin
from .base import Benchmark

__all__ = ["Benchmark", "load_plugin_path", "registry"]


def _classes(module) -> dict[str, type[Benchmark]]:
    found = {}
    for name, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, Benchmark) and obj is not Benchmark and not getattr(obj, "abstract", False):
            found[getattr(obj, "name", None) or name] = obj
    return found


def load_plugin_path(path: str | Path) -> dict[str, type[Benchmark]]:
    """Benchmark classes of every `*.py` file in `path` (a directory) or of one file."""
    path = Path(path)
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    found: dict[str, type[Benchmark]] = {}
    for f in files:
        spec = importlib.util.spec_from_file_location(f"dmetabench_user_{f.stem}", f)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load plugin file {f}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        found.update(_classes(module))
    return found


def registry(plugin_paths: list[str] | None = None) -> dict[str, type[Benchmark]]:
    """Built-in plugins plus those found under `plugin_paths`, by operation name."""
    reg = _classes(builtin)
    try:  # plusfs-native plugins exist when the plusfs Python module is installed
        from . import plusfs_native

        reg.update(_classes(plusfs_native))
    except ImportError:
        pass
    for p in plugin_paths or []:
        reg.update(load_plugin_path(p))
    return reg
