"""Where ctbuild's settings come from: the ``CTBUILD_*`` environment and the cache directory.

The only module that spells the environment variables' names and the default cache directory,
so that the command line, the build, the tuner and the runtime agree on which cache they use.

The cache directory, first that is set (`choose_cache`):
  1. ``--cache DIR`` on the command line (commands only; relative to the current directory);
  2. ``$CTBUILD_CACHE_DIR`` (relative to the current directory);
  3. ``cache_dir`` in the project config (relative to that file): ``--config`` (commands),
     else ``$CTBUILD_CONFIG``, else the ``ctbuild.toml`` (or ``pyproject.toml`` with
     ``[tool.ctbuild]``) found upward from the kernel module's directory (the runtime), then
     upward from the current directory;
  4. ``.ctbuild-cache`` in the current directory.

Choosing reads a few files and creates nothing. The runtime chooses once per process, at the
first kernel call, never at ``import ctbuild``; with ``CTBUILD_CACHE_DIR`` set it reads no file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The cache directory when nothing else names one (relative to the current directory).
DEFAULT_CACHE_DIR = ".ctbuild-cache"
#: File names of a project config, in the order each folder is searched.
CONFIG_NAMES = ("ctbuild.toml", "pyproject.toml")

#: The cache directory for every command and the runtime (below ``--cache``, above the config).
CACHE_DIR_ENV = "CTBUILD_CACHE_DIR"
#: The project config whose ``cache_dir`` the runtime and commands use (below ``--config``).
CONFIG_ENV = "CTBUILD_CONFIG"
#: What the runtime does on a miss: strict, default or tune.
MODE_ENV = "CTBUILD_MODE"
#: ``1``: the runtime always launches the default config (tuning records are not read).
DISABLE_AUTOTUNE_ENV = "CTBUILD_DISABLE_AUTOTUNE"
#: A file the runtime appends each distinct miss to (for ``precompile --from-record``).
RECORD_ENV = "CTBUILD_RECORD"
#: Pins the recorded toolchain fingerprint the runtime and the tuner serve from.
TOOLCHAIN_ENV = "CTBUILD_TOOLCHAIN"

#: ``ir``: before a serving process first loads a cached CUBIN, check its TileIR digest.
VERIFY_ENV = "CTBUILD_VERIFY"
#: The values `VERIFY_ENV` takes (unset: no check).
VERIFY_MODES = ("ir",)
#: How many call layouts a kernel keeps resolved (memo and table) before it starts over.
MAX_LAYOUTS_ENV = "CTBUILD_MAX_LAYOUTS"
DEFAULT_MAX_LAYOUTS = 4096
#: The range `max_layouts` accepts: at least a serving loop's few sizes; at most what a few GB
#: of host memory holds (a layout keeps ~4 KB).
MAX_LAYOUTS_RANGE = (16, 1 << 20)

#: Values of a boolean variable that mean "on".
TRUE_WORDS = ("1", "true", "yes", "on")


class SettingsError(ValueError):
    """A setting names a config file that is missing or not valid TOML."""


def env(name: str) -> str | None:
    """A ``CTBUILD_*`` variable's value; unset and empty are both None."""
    return os.environ.get(name) or None


def env_flag(name: str) -> bool:
    """Whether a boolean ``CTBUILD_*`` variable is on (``1``, ``true``, ``yes``, ``on``)."""
    return (os.environ.get(name) or "").strip().lower() in TRUE_WORDS


def max_layouts() -> int:
    """``CTBUILD_MAX_LAYOUTS`` (default 4096); a value that is not a whole number in
    `MAX_LAYOUTS_RANGE` is refused with `SettingsError` naming the range."""
    raw = env(MAX_LAYOUTS_ENV)
    if raw is None:
        return DEFAULT_MAX_LAYOUTS
    lo, hi = MAX_LAYOUTS_RANGE
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise SettingsError(f"{MAX_LAYOUTS_ENV}={raw!r}: give a whole number of call layouts "
                            f"from {lo} to {hi} (default {DEFAULT_MAX_LAYOUTS})")
    return value


def verify_mode() -> str | None:
    """``CTBUILD_VERIFY`` (``ir``), or None; another value is refused naming the ones known."""
    value = (env(VERIFY_ENV) or "").strip().lower() or None
    if value is not None and value not in VERIFY_MODES:
        raise ValueError(f"{VERIFY_ENV}={value!r} is not one of {', '.join(VERIFY_MODES)} "
                         "(unset it for no check)")
    return value


@dataclass(frozen=True)
class CacheChoice:
    """The cache directory (absolute, not resolved) and why it is that one, in words."""
    path: Path
    why: str

    def __str__(self) -> str:
        return f"{self.path} ({self.why})"


def config_in(folder: Path) -> Path | None:
    """The project config in one folder: ``ctbuild.toml``, else a ``pyproject.toml`` with a
    ``[tool.ctbuild]`` table."""
    for name in CONFIG_NAMES:
        candidate = folder / name
        if candidate.is_file() and (name == "ctbuild.toml" or "[tool.ctbuild]" in
                                    candidate.read_text(errors="replace")):
            return candidate
    return None


def find_config(*starts: Path) -> Path | None:
    """The first project config found upward from each of ``starts`` in turn (a few stat
    calls per folder), or None."""
    for start in starts:
        folder = start.absolute()
        for each in (folder, *folder.parents):
            found = config_in(each)
            if found is not None:
                return found
    return None


def project_config(given: str | os.PathLike[str] | None = None, *, near: Path | None = None
                   ) -> tuple[Path | None, str]:
    """(the project config, how it was found): ``given`` (``--config``), else
    ``$CTBUILD_CONFIG``, else found upward from ``near`` then from the current directory."""
    if given:
        return Path(given), "--config"
    if (named := env(CONFIG_ENV)) is not None:
        if not Path(named).is_file():
            raise SettingsError(f"{CONFIG_ENV}={named} is not a file; point it at the project's "
                                "ctbuild.toml or unset it")
        return Path(named), CONFIG_ENV
    starts = ([near] if near is not None else []) + [Path.cwd()]
    return find_config(*starts), "found"


def config_table(file: Path) -> dict[str, Any]:
    """The ctbuild settings of a config file (a pyproject.toml's ``[tool.ctbuild]``). tomllib
    is imported here, where a file is read, not with this module (10 ms the runtime need not
    pay)."""
    import tomllib
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{file}: not a readable TOML file ({exc}); fix it or point "
                            f"{CONFIG_ENV} elsewhere") from None
    table = data.get("tool", {}).get("ctbuild", {}) if file.name == "pyproject.toml" else data
    return table if isinstance(table, dict) else {}


def config_cache_dir(file: Path) -> str | None:
    """The ``cache_dir`` a config file sets (None: it sets none)."""
    value = config_table(file).get("cache_dir")
    return value if isinstance(value, str) and value else None


def cache_choice(flag: str | os.PathLike[str] | None = None, *, config_value: str | None = None,
                 config_file: Path | None = None, how: str = "found") -> CacheChoice:
    """The order of the module doc, given the config file and the ``cache_dir`` it sets."""
    if flag:
        return CacheChoice(Path(flag).expanduser().absolute(), "--cache")
    if (from_env := env(CACHE_DIR_ENV)) is not None:
        return CacheChoice(Path(from_env).expanduser().absolute(), CACHE_DIR_ENV)
    named = f" ({how})" if how != "found" else ""
    if config_value and config_file is not None:
        return CacheChoice(Path(os.path.normpath(config_file.parent.absolute() / config_value)),
                           f"cache_dir in {config_file.absolute()}{named}")
    default = Path(DEFAULT_CACHE_DIR).absolute()
    if config_file is not None:
        return CacheChoice(default, f"the default: {config_file.absolute()}{named} sets no "
                                    "cache_dir")
    return CacheChoice(default, f"the default: no {CACHE_DIR_ENV}, no {CONFIG_ENV} and no "
                                "ctbuild.toml found")


def not_a_config(file: Path) -> str:
    """Why ``file``, not a regular file, cannot be read as a config (``/dev/null`` exists)."""
    if file.exists():
        return f"config file {file} is not a regular file: pass a ctbuild.toml or pyproject.toml"
    return f"config file {file} does not exist"


def choose_cache(flag: str | os.PathLike[str] | None = None, *,
                 config: str | os.PathLike[str] | None = None,
                 near: Path | None = None) -> CacheChoice:
    """The cache directory and why (the module doc's order); reads the config file only when
    neither ``flag`` nor ``$CTBUILD_CACHE_DIR`` decides. Creates nothing."""
    if flag or env(CACHE_DIR_ENV) is not None:
        return cache_choice(flag)
    file, how = project_config(config, near=near)
    if file is not None and not file.is_file():
        raise SettingsError(not_a_config(file))
    value = config_cache_dir(file) if file is not None else None
    return cache_choice(config_value=value, config_file=file, how=how)


def record_file() -> Path | None:
    """The ``CTBUILD_RECORD`` file misses are appended to, or None."""
    value = env(RECORD_ENV)
    return Path(value) if value else None
