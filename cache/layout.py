"""The on-disk layout of a cache directory (see the package docstring), its version marker, and
whether this user may write it (`resolve_readonly`)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import CacheError, ReadOnlyCacheError
from .namespace import Namespace
from .user_files import FileTooLargeError, NotAFileError, read_regular

LAYOUT_FILE = "ctbuild-cache.json"
LAYOUT = {"format": "ctbuild-cache", "version": 1}
QUARANTINE_DIR = "quarantine"
#: The largest layout marker read (it holds about 40 bytes).
MAX_LAYOUT_BYTES = 4096
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Namespaces:
    """The four namespaces of one cache directory."""

    blobs: Namespace  # digest -> CUBIN bytes (always a file)
    compile: Namespace  # compile key -> JSON entry; tag = blob digest
    tuning: Namespace  # tuning key -> JSON record
    toolchains: Namespace  # toolchain fingerprint -> JSON profile

    def all(self) -> tuple[Namespace, ...]:
        return (self.blobs, self.compile, self.tuning, self.toolchains)


def open_namespaces(root: Path, *, readonly: bool) -> Namespaces:
    return Namespaces(
        blobs=Namespace(root / "blobs", readonly=readonly, inline=False),
        compile=Namespace(root / "compile", readonly=readonly, inline=True, tag_index=True),
        tuning=Namespace(root / "tuning", readonly=readonly, inline=True),
        toolchains=Namespace(root / "toolchains", readonly=readonly, inline=True),
    )


def check_layout(root: Path, *, readonly: bool) -> None:
    """Refuse a directory written in a layout this code does not know; stamp a new writable one.

    A missing marker on a read-only dir is accepted (an empty or pre-marker cache reads as v1).
    """
    marker = root / LAYOUT_FILE
    try:
        found = json.loads(read_regular(marker, limit=MAX_LAYOUT_BYTES, what="a layout marker"))
    except FileNotFoundError:
        if not readonly:
            fd, tmp = tempfile.mkstemp(prefix=f".{LAYOUT_FILE}.", dir=root)
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps(LAYOUT) + "\n")
            os.replace(tmp, marker)  # atomic: concurrent openers all write the same text
        return
    except (OSError, ValueError, NotAFileError, FileTooLargeError) as exc:
        raise CacheError(f"{marker} is unreadable ({exc}); is {root} a ctbuild cache?") from None
    if (not isinstance(found, dict) or found.get("format") != LAYOUT["format"]
            or found.get("version") != LAYOUT["version"]):
        raise CacheError(
            f"{root} holds cache layout {found!r}; this ctbuild reads {LAYOUT!r}. "
            "Use the ctbuild version that wrote it, or point --cache / CTBUILD_CACHE_DIR at a fresh directory."
        )


def unwritable(path: Path) -> Path | None:
    """The first of the cache directory, its namespaces and their indexes that this user may not
    write (-wal/-shm files come and go with writers; a path that vanished since the glob is no
    evidence); None when all are writable."""
    for p in (path, *path.glob("*/"), *path.glob("*/cache.db")):
        if p.exists() and not os.access(p, os.W_OK):
            return p
    return None


def is_writable(path: Path) -> bool:
    """Whether this process could write the cache at ``path`` (the directory, its namespaces and
    their indexes); asks the OS, writes nothing."""
    return unwritable(path) is None


def resolve_readonly(path: Path, readonly: bool | None) -> bool:
    """Decide the store's mode; creates the directory when it may write."""
    if readonly:
        return True
    if path.exists() and not path.is_dir():
        raise CacheError(f"cache path {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = unwritable(path) is None
        reason = "is not writable"
    except OSError as exc:
        writable, reason = False, f"cannot be created ({exc.strerror})"
    if writable:
        return False
    if readonly is False:
        raise ReadOnlyCacheError(
            f"cache directory {path} {reason}, and this writes the cache: point --cache / "
            "CTBUILD_CACHE_DIR at a writable directory (`ctbuild cache export` / `import` copy "
            "the cache there)")
    log.warning(
        "cache directory %s %s: opened read-only (lookups work; writes raise ReadOnlyCacheError)", path, reason
    )
    return True
