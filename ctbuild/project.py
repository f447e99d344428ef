"""Project configuration: ``ctbuild.toml`` or ``[tool.ctbuild]`` in ``pyproject.toml``.

Precedence: command-line flags > the environment (cache dir only, `ctbuild.settings`) > the
file > defaults. The file is ``--config``, else ``$CTBUILD_CONFIG``, else the one found upward
from the current directory.
Relative paths in the file are relative to the file, so a build works from any directory.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import settings
from .arch import Arch, parse_archs
from .declaration_checks import article, cap_problem, did_you_mean
from .declare import DEFAULT_CAP, DeclarationError, TunedKernel, registered
from .device_table import parse_devices

_KEYS = {"modules": list, "archs": list, "cache_dir": str, "cap": int, "paths": list,
         "generic_fallback": bool, "devices": dict}


class ConfigError(ValueError):
    """The config file is missing, malformed, or names things that do not exist."""


@dataclass
class Project:
    """A loaded configuration: where things are and what to build."""
    path: Path | None
    modules: list[str] = field(default_factory=list)
    archs: list[Arch] = field(default_factory=lambda: [Arch("sm_90")])
    cache_dir: Path = Path(settings.DEFAULT_CACHE_DIR)
    #: the cache directory as chosen, with why (`settings.choose_cache`'s order)
    cache: settings.CacheChoice = field(default_factory=lambda: settings.cache_choice())
    cap: int = DEFAULT_CAP
    paths: list[Path] = field(default_factory=list)
    generic: bool = True            # build the generic fallback CUBINs (generic_fallback)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)  # plan-time [devices]

    def kernels(self) -> list[TunedKernel]:
        """Import the configured modules and return the kernels they declare."""
        for p in reversed(self.paths):
            if str(p) not in sys.path:
                sys.path.insert(0, str(p))
        for name in self.modules:
            try:
                importlib.import_module(name)
            except DeclarationError:
                raise  # already names the kernel and the fix
            except ModuleNotFoundError as exc:
                if exc.name is None or not name.startswith(exc.name):  # a module *it* imports
                    raise ConfigError(self._import_failure(name, exc)) from exc
                raise ConfigError(f"{self.where}: cannot import module {name!r}: {exc} "
                                  f"(searched {', '.join(map(str, self.paths)) or 'sys.path'})"
                                  ) from exc
            except Exception as exc:  # noqa: BLE001 - user code: any error is reported, one line
                raise ConfigError(self._import_failure(name, exc)) from exc
        found = [k for k in registered() if k.module in self.modules]
        if not found:
            raise ConfigError(f"{self.where}: modules {self.modules} declare no "
                              "@ctbuild.autotune kernel")
        return found

    @property
    def where(self) -> str:
        return str(self.path) if self.path else "configuration"

    def _import_failure(self, name: str, exc: BaseException) -> str:
        """One line: which file and line of the kernel module failed, and how."""
        if isinstance(exc, SyntaxError):
            where, what = f"{exc.filename}:{exc.lineno}", f"SyntaxError: {exc.msg}"
        else:
            frames = traceback.extract_tb(exc.__traceback__)
            ours = [f for f in frames if any(_within(f.filename, p) for p in self.paths)]
            frame = (ours or frames)[-1]
            where, what = f"{frame.filename}:{frame.lineno}", f"{type(exc).__name__}: {exc}"
        return (f"kernel module {name!r} (from {self.where}) failed to import at {where}: {what}; "
                "fix it, or run with -v for the traceback")


def select_kernels(kernels: list[TunedKernel], names: list[str] | None) -> list[TunedKernel]:
    """The kernels named by ``--kernel`` (repeatable), in declaration order; all without names.
    An unknown name is a `ConfigError` listing the project's kernels, with a "did you mean"."""
    if not names:
        return kernels
    known = [k.name for k in kernels]
    for name in names:
        if name not in known:
            raise ConfigError(f"--kernel {name}: no such kernel in this project"
                              f"{did_you_mean(name, known)}; "
                              f"kernels: {', '.join(known)}")
    return [k for k in kernels if k.name in names]


def _arch_hint(message: str) -> str:
    """`` (did you mean 'sm_90'?)`` for an arch written without its underscore."""
    match = re.search(r"'sm-?(\d+)'", message)
    return f" (did you mean 'sm_{match.group(1)}'?)" if match else ""


def _within(filename: str, directory: Path) -> bool:
    if filename.startswith("<"):  # <string>, <frozen ...>: not a file
        return False
    try:
        return Path(filename).resolve().is_relative_to(directory)
    except (OSError, ValueError):
        return False


def load_project(path: str | os.PathLike | None = None, *, archs: str | list[str] | None = None,
                 cache_dir: str | None = None, cap: int | None = None) -> Project:
    """Read the config file (``path``, else ``$CTBUILD_CONFIG``, else found upward from the
    current directory: `settings.project_config`) and apply overrides."""
    try:
        file, how = settings.project_config(path)
    except settings.SettingsError as exc:
        raise ConfigError(str(exc)) from None
    table: dict[str, Any] = {}
    if file is not None:
        if file.is_dir():
            inside = settings.config_in(file)
            raise ConfigError(f"--config {file} is a directory; pass the config file itself"
                              + (f", e.g. --config {inside}" if inside else
                                 " (it holds no ctbuild.toml or pyproject.toml with [tool.ctbuild])"))
        if not file.is_file():
            raise ConfigError(settings.not_a_config(file))
        try:
            data = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
        table = data.get("tool", {}).get("ctbuild") if file.name == "pyproject.toml" else data
        if table is None:
            raise ConfigError(f"{file}: has no [tool.ctbuild] table")
        for k, v in table.items():
            if k not in _KEYS:
                raise ConfigError(f"{file}: unknown key {k!r}{did_you_mean(k, _KEYS)}; known "
                                  f"keys: {', '.join(_KEYS)}")
            if not isinstance(v, _KEYS[k]) or (isinstance(v, bool) and _KEYS[k] is not bool):
                raise ConfigError(f"{file}: {k!r} must be {article(_KEYS[k].__name__)}, "
                                  f"got {v!r}")
    base = file.parent.resolve() if file else Path.cwd()
    project = Project(path=file)
    project.modules = [str(m) for m in table.get("modules", [])]
    project.paths = [(base / p).resolve() for p in table.get("paths", ["."])]
    try:
        project.archs = parse_archs(archs or table.get("archs") or ["sm_90"])
    except ValueError as exc:  # blame where the archs came from: the flag, else the file
        given = ",".join(archs) if isinstance(archs, list) else archs
        where = f"--arch {given}" if archs else f"{project.where}: archs"
        raise ConfigError(f"{where}: {exc}{_arch_hint(str(exc))}") from exc
    project.generic = bool(table.get("generic_fallback", True))
    try:
        project.devices = parse_devices(table.get("devices", {}), project.where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    project.cap = cap if cap is not None else table.get("cap", DEFAULT_CAP)
    if problem := cap_problem(project.cap):
        raise ConfigError(f"{project.where}: {problem}")
    project.cache = settings.cache_choice(cache_dir, config_value=table.get("cache_dir"),
                                          config_file=file, how=how)
    project.cache_dir = project.cache.path.resolve()
    if file is None:
        raise ConfigError(f"no config file found: neither {Path.cwd()} nor a folder above it has "
                          "a ctbuild.toml or a pyproject.toml with [tool.ctbuild], and "
                          f"{settings.CONFIG_ENV} is unset; pass --config PATH or run from the "
                          "project directory")
    if not project.modules:
        raise ConfigError(f"{project.where}: no modules to import; set modules = [\"pkg.kernels\"]")
    return project
