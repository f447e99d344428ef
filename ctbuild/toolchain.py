"""The toolchain fingerprint: everything outside the kernel that changes the CUBIN.

Inputs: cuda-tile's version, ``tileiras --version``, the identity (version + content hash) of the
ptxas and libnvvm tileiras will really use, the TileIR bytecode version, and the env vars that
change compilation. Every env var cuTile reads is classified as key-relevant or neutral
(Triton's rule); an unclassified ``CUDA_TILE_*`` var is an error, not a silent mix.

The runtime (GPU nodes, possibly without tileiras) cannot probe the compiler; it takes the
fingerprint recorded in the cache by the build whose cuda-tile version and relevant env match.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import xxhash

from . import cutile, settings

if TYPE_CHECKING:
    from ctbuild.cache import Store

#: Env vars that change what cuTile emits: part of the fingerprint.
KEY_ENV_VARS = ("EXPERIMENTAL_CUDA_TILE_DEBUG_BUILD", "CUDA_TILE_TESTING_DISABLE_DIV",
                "CUDA_TILE_TESTING_DISABLE_TOKEN_ORDER")
#: Env vars cuTile reads that do not change the CUBIN (where files go, logging, timeouts).
NEUTRAL_ENV_VARS = ("CUDA_TILE_CACHE_DIR", "CUDA_TILE_CACHE_SIZE", "CUDA_TILE_TEMP_DIR",
                    "CUDA_TILE_COMPILER_TIMEOUT_SEC", "CUDA_TILE_LOGS", "CUDA_TILE_DUMP_TILEIR",
                    "CUDA_TILE_DUMP_BYTECODE", "CUDA_TILE_ENABLE_CRASH_DUMP")
_ENV_PREFIXES = ("CUDA_TILE_", "EXPERIMENTAL_CUDA_TILE")
#: Env vars tileiras reads to find ptxas and libnvvm (from its own strings): any of them can
#: swap the compiler behind an unchanged ``tileiras --version``.
TOOLKIT_ENV_VARS = ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH")


class ToolchainError(RuntimeError):
    """The compiler toolchain is missing, broken, or not what the cache was built with."""


def key_env() -> dict[str, str]:
    """The key-relevant env vars that are set, after checking none is unclassified."""
    unknown = sorted(k for k in os.environ if k.startswith(_ENV_PREFIXES)
                     and k not in KEY_ENV_VARS and k not in NEUTRAL_ENV_VARS)
    if unknown:
        raise ToolchainError(
            f"unclassified cuTile env var(s) {', '.join(unknown)}: ctbuild cannot tell whether "
            "they change the compiled code; unset them, or report them so they get classified")
    return {k: os.environ[k] for k in KEY_ENV_VARS if k in os.environ}


def stripped_env_vars() -> tuple[str, ...]:
    """The toolkit variables ctbuild removes from every compile's environment.

    The pip tileiras uses the ptxas/libnvvm installed beside it, so all of them go. A system
    tileiras (one found on PATH or under $CUDA_HOME) is meant to use $CUDA_HOME's: that one
    stays, and the probe fingerprints the ptxas/libnvvm it points to."""
    try:
        _, uses_home = find_tileiras()
    except ToolchainError:
        uses_home = False
    return tuple(v for v in TOOLKIT_ENV_VARS if not (uses_home and v == "CUDA_HOME"))


@contextlib.contextmanager
def compile_environment() -> Iterator[None]:
    """Run a compile with `stripped_env_vars` unset (cuTile hands tileiras ``os.environ``).
    Callers hold cuTile's compiler lock, so no other compile sees the env in between."""
    saved = {v: os.environ.pop(v) for v in stripped_env_vars() if v in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def cutile_version() -> str:
    from cuda.tile import __version__
    return str(__version__)


@functools.cache
def _file_identity(path: str) -> dict[str, Any]:
    data = Path(path).read_bytes()
    return {"bytes": len(data), "xxh3": xxhash.xxh3_128_hexdigest(data)}


def _version_text(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], check=True, capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"{binary} --version failed: {exc}") from exc
    return out.strip()


@dataclass(frozen=True)
class Toolchain:
    """A probed toolchain: the fingerprint, and the profile it was computed from."""
    fingerprint: str
    profile: dict[str, Any]
    paths: dict[str, str]


def find_tileiras() -> tuple[str, bool]:
    """(path to tileiras, whether it will use $CUDA_HOME's ptxas/libnvvm), as cuTile finds it."""
    try:
        return cutile.find_compiler_bin()
    except FileNotFoundError as exc:
        raise ToolchainError(str(exc)) from exc


def _companions(tileiras: str, uses_cuda_home: bool) -> tuple[str, str]:
    """ptxas and libnvvm that this tileiras will load."""
    base = Path(tileiras).resolve().parent
    if uses_cuda_home and os.environ.get("CUDA_HOME"):
        home = Path(os.environ["CUDA_HOME"])
        return str(home / "bin" / "ptxas"), str(home / "nvvm" / "lib64" / "libnvvm.so")
    return str(base / "ptxas"), str(base.parent / "lib" / "libnvvm.so.4")


def cuda_home_problem() -> str | None:
    """Why $CUDA_HOME would break tileiras, or None. tileiras uses only $CUDA_HOME's ptxas and
    libnvvm when it is set and tileiras is not the pip one; an older toolkit fails with exit 5."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        return None
    try:
        path, uses_home = find_tileiras()
    except ToolchainError:
        return None
    if not uses_home:
        return None
    ptxas = Path(home) / "bin" / "ptxas"
    if not ptxas.exists():
        return f"CUDA_HOME={home} has no bin/ptxas, which {path} would use"
    mine, theirs = _release(_version_text(path)), _release(_version_text(str(ptxas)))
    if mine != theirs:
        return (f"CUDA_HOME={home} holds CUDA {theirs} but tileiras is {mine}: tileiras would "
                "use that older ptxas/libnvvm and fail with exit 5; unset CUDA_HOME")
    return None


def _release(version_text: str) -> str:
    for token in version_text.replace(",", " ").split():
        if token.startswith("V") and token[1:2].isdigit():
            return token[1:]
    return version_text.splitlines()[-1] if version_text else "?"


#: This process's probed (or adopted) toolchain.
_probed: Toolchain | None = None


def probe() -> Toolchain:
    """Probe the local toolchain (runs tileiras; ~1 s the first time, then kept per process;
    a build worker may `adopt` its driver's probe instead)."""
    global _probed
    if _probed is None:
        _probed = _probe()
    return _probed


def _locate() -> dict[str, str]:
    """Where this process finds tileiras, ptxas and libnvvm (what `_probe` reads)."""
    tileiras, uses_home = find_tileiras()
    ptxas, nvvm = _companions(tileiras, uses_home)
    return {"tileiras": tileiras, "ptxas": ptxas, "libnvvm": nvvm}


def _probe() -> Toolchain:
    paths = _locate()
    tileiras, ptxas, nvvm = paths["tileiras"], paths["ptxas"], paths["libnvvm"]
    for what, path in (("ptxas", ptxas), ("libnvvm", nvvm)):
        if not Path(path).exists():
            raise ToolchainError(f"{what} not found at {path} (tileiras at {tileiras} needs it)")
    if (problem := cuda_home_problem()):
        raise ToolchainError(problem)
    with compile_environment():
        bytecode = cutile.max_bytecode_version()
    profile = {
        "cuda_tile": cutile_version(),
        "tileiras": _version_text(tileiras),
        "tileiras_file": _file_identity(tileiras),
        "ptxas": _version_text(ptxas),
        "ptxas_file": _file_identity(ptxas),
        "libnvvm_file": _file_identity(nvvm),
        "bytecode_version": bytecode.name.removeprefix("V_").replace("_", "."),
        "env": key_env(),
    }
    return Toolchain(fingerprint_of(profile), profile, paths)


def shareable(toolchain: Toolchain) -> dict[str, Any]:
    """A probe to hand to build workers (JSON-able): `adopt` takes it on the same machine."""
    return {"fingerprint": toolchain.fingerprint, "profile": toolchain.profile,
            "paths": toolchain.paths, "stamps": _stamps(toolchain.paths)}


def adopt(shared: dict[str, Any] | None) -> bool:
    """Take another process's probe (`shareable`) as this process's, when this process would
    probe the very same files on the same machine since its boot; returns whether it did.

    Probing runs tileiras and ptxas and hashes them and libnvvm: 0.4-0.9 s in each of 64 build
    workers starting at once on one host, where the driver has just done it. Same machine boot,
    same paths, same device and inode, same size and modification and change times mean the
    same bytes (any write moves the change time, which no user can set back); the cuda-tile
    version and the key env vars must match too. Anything else (another node, another
    install, a file replaced, no boot id) adopts nothing, and `probe` runs as usual."""
    global _probed
    if _probed is not None or not isinstance(shared, dict):
        return False
    try:
        paths = _locate()
        if paths != shared.get("paths") or cuda_home_problem() is not None:
            return False
        mine = _stamps(paths)
        if mine["boot"] is None or mine != shared.get("stamps"):
            return False
        toolchain = Toolchain(str(shared["fingerprint"]), dict(shared["profile"]), paths)
    except (OSError, ToolchainError, KeyError, TypeError, ValueError):
        return False
    _probed = toolchain
    return True


def _stamps(paths: dict[str, str]) -> dict[str, Any]:
    """What identifies these files' bytes on this machine without reading them (see `adopt`),
    plus the cuda-tile version and key env vars of this process."""
    try:
        boot: str | None = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = None
    files = {}
    for what, path in sorted(paths.items()):
        st = os.stat(path)
        files[what] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return {"boot": boot, "host": platform.node(), "files": files,
            "cuda_tile": cutile_version(), "env": key_env()}


def fingerprint_of(profile: dict[str, Any]) -> str:
    return xxhash.xxh3_128_hexdigest(json.dumps(profile, sort_keys=True).encode())


def record_in(store: Store, toolchain: Toolchain) -> None:
    """Record the toolchain's profile in a cache, with where and when (not fingerprinted):
    serving nodes pick their keys' toolchain from these records, newest first on a tie."""
    import datetime
    store.put_toolchain(toolchain.fingerprint, {
        **toolchain.profile,
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "created": datetime.datetime.now(datetime.UTC).isoformat()})


def select_recorded(profiles: dict[str, dict[str, Any]]) -> str | None:
    """Pick the build's toolchain from the profiles recorded in a cache, without tileiras.

    A GPU node may have cuda-tile without its compiler, so it cannot probe; the profiles whose
    cuda-tile version and key-relevant env match this process are the candidates. With several
    (a cache shared by builds of two toolchains) the local compiler decides when present, else
    the newest record wins. ``CTBUILD_TOOLCHAIN`` pins one explicitly.
    """
    pinned = settings.env(settings.TOOLCHAIN_ENV)
    if pinned:
        return pinned
    env, version = key_env(), cutile_version()
    matching = {fp: p for fp, p in profiles.items()
                if p.get("cuda_tile") == version and p.get("env", {}) == env}
    if len(matching) <= 1:
        return next(iter(matching), None)
    try:
        local = probe().fingerprint
        if local in matching:
            return local
    except ToolchainError:
        pass
    return max(matching, key=lambda fp: str(matching[fp].get("created", "")))


def recorded_mismatch(profiles: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(why, what to do) when `select_recorded` finds no profile for this process: the
    cuda-tile versions the cache was built with (each serves only its own), else the
    key-relevant env vars that differ. A cache that is the right one but of another version
    is fixed by the version, not by pointing elsewhere."""
    version = cutile_version()
    if not profiles:
        return ("records no toolchain (no build finished into it)",
                "build it: ctbuild precompile --config ctbuild.toml --cache DIR")
    built = sorted({str(p.get("cuda_tile")) for p in profiles.values()})
    if version not in built:
        return (f"was built with cuda-tile {', '.join(built)}, but this process has cuda-tile "
                f"{version}", f"serve with the build's version (pip install "
                f"'cuda-tile=={built[-1]}'), or rebuild this cache under {version} "
                "(ctbuild precompile)")
    here = key_env()
    there = next(dict(p.get("env", {})) for p in profiles.values()
                 if p.get("cuda_tile") == version)
    diff = ", ".join(f"{k}={there.get(k, 'unset')} at build, {here.get(k, 'unset')} here"
                     for k in sorted(set(here) | set(there)) if here.get(k) != there.get(k))
    return (f"was built with other key-relevant env vars ({diff})",
            "serve with the build's values of them, or rebuild this cache in this env "
            "(ctbuild precompile)")


def toolchain_for(store: Store) -> str:
    """The toolchain to tune or build against for a cache: the one its entries were built with
    (`select_recorded`), else the local compiler's (probed; `ToolchainError` without one)."""
    fp = select_recorded(store.toolchains())
    return fp if fp else probe().fingerprint
