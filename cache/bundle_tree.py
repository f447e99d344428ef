"""Import an unpacked bundle: the directory that an image volume, GKM's extraction or ``tar -x``
makes of a bundle (an OCI image's layer is the bundle, so mounting the image gives this tree).

The tree is read as a bundle in place — :class:`TreeTar` presents its files as an uncompressed
tar, members in the bundle's order, without copying a byte — and imported through
:func:`ctbuild.cache.bundle.import_bundle`, so every check applies unchanged, the signature
included: a signed bundle's ``signature.json`` covers its members' bytes, not the tar they came
in. Before anything is read, the tree must hold only the bundle's names as regular files (no
links, FIFOs or devices), at most the import's member count, each within its member size: those
come from ``lstat``, so a huge (or sparse) file is refused without reading it. A file changed
while it is read fails the import (undone, as any failure).
"""

from __future__ import annotations

import bisect
import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

from .bundle import BLOB_MEMBER, CHUNK, DEFAULT_LIMITS, DOCUMENTS, MANIFEST, SIGNATURE
from .bundle_limits import ImportLimits, check_members
from .errors import CacheError

BLOCK = tarfile.BLOCKSIZE


def import_tree(store: Any, root: Path, **options: Any) -> dict[str, Any]:
    """Import the unpacked bundle at ``root`` into ``store`` (options as import_bundle)."""
    members = _members(root, options.get("limits", DEFAULT_LIMITS))
    # buffered: tarfile wants whole reads, and a raw read stops at a member's end
    with io.BufferedReader(TreeTar(root, members), CHUNK) as stream:
        try:
            return store.import_bundle(stream, **options)
        except OSError as exc:
            raise CacheError(f"cannot read {root} for import ({exc.strerror or exc}); nothing was imported") from None


class TreeTar(io.RawIOBase):
    """The files of a tree as one seekable, uncompressed tar: each member's header, the file's
    bytes (read from the file when asked), padding to a block; then the end-of-archive blocks."""

    def __init__(self, root: Path, members: list[tuple[str, int]]) -> None:
        super().__init__()
        self._root = root
        self._starts: list[int] = []
        self._parts: list[bytes | tuple[str, int]] = []  # header or padding bytes, or (member name, size)
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = size, 0o644, 0
            self._append(info.tobuf(tarfile.PAX_FORMAT))
            self._append((name, size))
            self._append(bytes(-size % BLOCK))
        self._append(bytes(2 * BLOCK))
        self._size = self._starts[-1] + self._length(self._parts[-1])
        self._pos = 0
        self._open: tuple[str, int] | None = None  # (member name, fd) of the file being read

    def _append(self, part: bytes | tuple[str, int]) -> None:
        start = self._starts[-1] + self._length(self._parts[-1]) if self._parts else 0
        self._starts.append(start)
        self._parts.append(part)

    @staticmethod
    def _length(part: bytes | tuple[str, int]) -> int:
        return part[1] if isinstance(part, tuple) else len(part)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            return 0
        index = bisect.bisect_right(self._starts, self._pos) - 1
        part, into = self._parts[index], self._pos - self._starts[index]
        want = min(len(buffer), self._length(part) - into)
        data = part[into:into + want] if isinstance(part, bytes) else self._file_bytes(part[0], into, want)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def _file_bytes(self, name: str, offset: int, size: int) -> bytes:
        """``size`` bytes of member ``name`` from ``offset``; the file is opened without
        following a link and must still be the regular file of the size listed."""
        if self._open is None or self._open[0] != name:
            self._close_file()
            fd = os.open(self._root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            self._open = (name, fd)
        fd = self._open[1]
        data = os.pread(fd, size, offset)
        if len(data) < size or not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"{self._root / name} changed while being imported; nothing was imported")
        return data

    def _close_file(self) -> None:
        if self._open is not None:
            os.close(self._open[1])
            self._open = None

    def close(self) -> None:
        self._close_file()
        super().close()


def _members(root: Path, limits: ImportLimits) -> list[tuple[str, int]]:
    """(name, size) of the tree's files in the bundle's member order; refuses anything else,
    and sizes and counts beyond ``limits``, from ``lstat`` alone."""
    if not (root / MANIFEST).is_file():
        raise CacheError(f"{root} holds no {MANIFEST}: not an unpacked ctbuild bundle or cache image")
    top: dict[str, int] = {}
    blobs: list[tuple[str, int]] = []
    for entry in os.scandir(root):
        if entry.name == "blobs" and entry.is_dir(follow_symlinks=False):
            blobs = _blobs(root / "blobs", limits)
        elif entry.name in (MANIFEST, SIGNATURE, *DOCUMENTS) and entry.is_file(follow_symlinks=False):
            top[entry.name] = _size(root / entry.name, entry, limits)
        else:
            raise CacheError(f"{root / entry.name} is not part of a bundle (or is a link): refusing {root}; "
                             "nothing was imported")
    ordered = [(name, top[name]) for name in (MANIFEST, *DOCUMENTS) if name in top]
    return ordered + blobs + ([(SIGNATURE, top[SIGNATURE])] if SIGNATURE in top else [])


def _blobs(directory: Path, limits: ImportLimits) -> list[tuple[str, int]]:
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            name = f"blobs/{entry.name}"
            if not BLOB_MEMBER.fullmatch(name) or not entry.is_file(follow_symlinks=False):
                raise CacheError(f"{directory / entry.name} is not a bundle blob (a regular file named by its "
                                 "digest): refusing the tree; nothing was imported")
            found.append((name, _size(directory / entry.name, entry, limits)))
            check_members(len(found), limits)
    return sorted(found)


def _size(path: Path, entry: os.DirEntry, limits: ImportLimits) -> int:
    """A member file's size, refused above the member limit before a byte of it is read."""
    size = entry.stat(follow_symlinks=False).st_size
    if size > limits.member_size:
        raise CacheError(f"{path} is {size / 2**20:.1f} MiB, above the {limits.member_size / 2**20:.0f} MiB "
                         "limit (--max-member-size); refusing the tree; nothing was imported")
    return size
