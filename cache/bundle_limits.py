"""What a bundle import may cost, checked before anything is written: members, bytes on disk,
JSON size, nesting and values.

A bundle is input from elsewhere. Its tar headers say how big each member is before a byte of it
is read, so the disk it would fill is known while the bundle is checked; the JSON documents are
read whole, so their size and shape bound the memory an import takes. Every limit has a default
far above a real cache (docs/cache.md) and a flag of ``ctbuild cache import``.

Disk: each blob is a file of its own in a two-level directory tree (``blobs/ab/cd/*.val``), so
a member costs its size rounded up to the filesystem's block, a block for the directory it may
need and an index row: 100,000 one-byte members take about 640 MiB, not 100 KB. Memory: a parsed
JSON value takes up to about 70 bytes whatever its text, so the number of values is capped as well
as the bytes (one value per `BYTES_PER_VALUE` bytes of the JSON size limit).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CacheError

MIB = 2**20
#: Free space an import leaves on the cache's filesystem beyond what it stores (bytes).
SPACE_MARGIN = 64 * MIB
#: What one index row and its share of the SQLite file and WAL take (bytes, generous).
ROW_BYTES = 512
#: How deeply a bundle's JSON may nest (a real entry nests about 5 deep).
MAX_DEPTH = 32
#: One JSON value allowed per this many bytes of `ImportLimits.json_size`.
BYTES_PER_VALUE = 16
NOTHING = "nothing was imported"
#: The largest blob the cache takes from outside: an import's default member limit, and what a
#: rebuild reads of a value file (real CUBINs: KB to tens of MB).
MAX_BLOB_SIZE = 256 * MIB


@dataclass(frozen=True)
class ImportLimits:
    """Caps of one import (``ctbuild cache import`` flags in parentheses)."""

    member_size: int = MAX_BLOB_SIZE    # one member (--max-member-size)
    members: int = 200_000              # members in all (--max-members)
    size: int = 64 * 2**30              # bytes it would take on disk, overhead included (--max-size)
    json_size: int = 32 * MIB           # the JSON documents together (--max-json-size)

    @property
    def json_values(self) -> int:
        return self.json_size // BYTES_PER_VALUE


class DiskBudget:
    """Running total of what the members seen so far would take on the cache's filesystem;
    refuses the bundle as soon as it exceeds the free space (less `SPACE_MARGIN`), its free
    inodes, or the caps."""

    def __init__(self, root: Path, limits: ImportLimits) -> None:
        self.root, self.limits = root, limits
        self.bytes = self.files = 0
        self.block = 4096
        self.free: int | None = None
        self.inodes: int | None = None
        try:
            st = os.statvfs(root)
        except OSError:
            return  # cannot tell: the write itself fails cleanly if the disk is full
        self.block = st.f_frsize or self.block
        self.free = st.f_bavail * st.f_frsize
        self.inodes = st.f_favail if st.f_files else None  # 0 files: no inode limit (btrfs)

    def add_file(self, size: int) -> None:
        """A blob the store does not hold yet: its file, a directory it may need, its row."""
        self.bytes += -(-size // self.block) * self.block + self.block + ROW_BYTES
        self.files += 1
        self._check()

    def add_rows(self, text_bytes: int, rows: int) -> None:
        """JSON entries stored inline in the index (written twice: WAL, then the database)."""
        self.bytes += 2 * text_bytes + rows * ROW_BYTES
        self._check()

    def _check(self) -> None:
        need = f"{self.bytes / MIB:.1f} MiB"
        if self.bytes > self.limits.size:
            raise CacheError(f"bundle would take more than {self.limits.size / MIB:.0f} MiB on disk (--max-size; "
                             f"{self.files} new files so far): refusing it; raise --max-size if it is "
                             f"expected; {NOTHING}")
        if self.free is not None and self.bytes + SPACE_MARGIN > self.free:
            raise CacheError(f"not enough free space in {self.root}: the bundle needs at least {need} "
                             f"({self.files} new files, {self.block}-byte blocks) and {self.free / MIB:.1f} MiB "
                             f"are free (keeping {SPACE_MARGIN // MIB} MiB spare); free space or import into a "
                             f"bigger volume; {NOTHING}")
        if self.inodes is not None and 2 * self.files > self.inodes:
            raise CacheError(f"not enough free inodes in {self.root}: the bundle adds at least {self.files} files "
                             f"and directories need more; {self.inodes} inodes are free; {NOTHING}")


def check_members(count: int, limits: ImportLimits) -> None:
    if count > limits.members:
        raise CacheError(f"bundle holds more than {limits.members} members (--max-members): refusing it; "
                         f"raise --max-members if it is expected; {NOTHING}")


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")


class JsonBudget:
    """Parses a bundle's JSON documents (after their size, which the caller checks), refusing
    one that nests deeper than `MAX_DEPTH` or would exceed the values left to the import,
    before ``json.loads`` builds anything."""

    def __init__(self, limits: ImportLimits) -> None:
        self.values_left = limits.json_values
        self.limits = limits

    def parse(self, name: str, data: bytes) -> Any:
        # Counted on the raw text (no copy without its strings: for millions of strings that
        # copy took more memory than the parse): a comma or bracket inside a string counts too,
        # which only errs on the safe side.
        if _depth(data) > MAX_DEPTH:
            raise CacheError(f"bundle member {name} nests JSON more than {MAX_DEPTH} deep: not a ctbuild "
                             f"bundle; {NOTHING}")
        values = 1 + sum(data.count(c) for c in (b",", b":", b"[", b"{"))
        if values > self.values_left:
            raise CacheError(f"bundle JSON holds more than {self.limits.json_values} values (one per "
                             f"{BYTES_PER_VALUE} bytes of --max-json-size {self.limits.json_size / MIB:.0f} MiB): "
                             f"refusing it; raise --max-json-size if it is expected; {NOTHING}")
        self.values_left -= values
        try:
            return json.loads(data, parse_constant=_no_constant)
        except RecursionError:  # unbalanced brackets escape `_depth`
            raise CacheError(f"bundle member {name} nests JSON too deeply: not a ctbuild bundle; "
                             f"{NOTHING}") from None
        except ValueError as exc:
            raise CacheError(f"bundle member {name} is not valid JSON ({exc}); {NOTHING}") from None


def _depth(data: bytes) -> int:
    """How deeply the brackets of ``data`` nest, counted up to `MAX_DEPTH` + 1 (each pass
    removes the innermost pairs; unbalanced brackets stop it early: then ``json.loads`` says
    what is wrong, or hits the recursion limit, which is caught)."""
    brackets = data.translate(_SQUARE, _NOT_BRACKETS)
    depth = 0
    while brackets and depth <= MAX_DEPTH:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets, depth = inner, depth + 1
    return depth


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")
