"""Where ctbuild's settings come from: the ``CTBUILD_*`` environment and the cache directory.

The only module that spells the environment variables' names and the default cache directory,
so that the command line, the build, the tuner and the runtime agree on which cache they use.

The cache directory, first that is set:
  1. ``--cache DIR`` on the command line (relative to the current directory);
  2. ``$CTBUILD_CACHE_DIR`` (relative to the current directory);
  3. ``cache_dir`` in the project's ``ctbuild.toml`` (relative to that file);
  4. ``.ctbuild-cache`` in the current directory.
"""
from __future__ import annotations

import os
from pathlib import Path

#: The cache directory when nothing else names one (relative to the current directory).
DEFAULT_CACHE_DIR = ".ctbuild-cache"

#: The cache directory for every command and the runtime (below ``--cache``, above the config).
CACHE_DIR_ENV = "CTBUILD_CACHE_DIR"
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

#: Values of a boolean variable that mean "on".
TRUE_WORDS = ("1", "true", "yes", "on")


def env(name: str) -> str | None:
    """A ``CTBUILD_*`` variable's value; unset and empty are both None."""
    return os.environ.get(name) or None


def env_flag(name: str) -> bool:
    """Whether a boolean ``CTBUILD_*`` variable is on (``1``, ``true``, ``yes``, ``on``)."""
    return (os.environ.get(name) or "").strip().lower() in TRUE_WORDS


def verify_mode() -> str | None:
    """``CTBUILD_VERIFY`` (``ir``), or None; another value is refused naming the ones known."""
    value = (env(VERIFY_ENV) or "").strip().lower() or None
    if value is not None and value not in VERIFY_MODES:
        raise ValueError(f"{VERIFY_ENV}={value!r} is not one of {', '.join(VERIFY_MODES)} "
                         "(unset it for no check)")
    return value


def cache_dir(flag: str | os.PathLike[str] | None = None, *,
              config_value: str | None = None, config_base: Path | None = None) -> Path:
    """The cache directory (see the module doc for the order), not resolved.

    ``config_value`` is the project file's ``cache_dir`` and ``config_base`` the file's folder,
    which a relative ``config_value`` is taken from."""
    if flag:
        return Path(flag)
    if (from_env := env(CACHE_DIR_ENV)) is not None:
        return Path(from_env)
    if config_value:
        return (config_base or Path()) / config_value
    return Path(DEFAULT_CACHE_DIR)


def record_file() -> Path | None:
    """The ``CTBUILD_RECORD`` file misses are appended to, or None."""
    value = env(RECORD_ENV)
    return Path(value) if value else None
