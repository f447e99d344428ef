"""Import an unpacked bundle: the directory that an image volume, GKM's extraction or ``tar -x``
makes of a bundle (an OCI image's layer is the bundle, so mounting the image gives this tree).

The tree is packed back into a bundle (members in the bundle's order, beside the cache) and
imported through :func:`ctbuild.cache.bundle.import_bundle`, so every check applies unchanged, the
signature included: a signed bundle's ``signature.json`` covers its members' bytes, not the tar
they came in. Before packing, the tree must hold only the bundle's names as regular files (no
links), at most :data:`MAX_TREE_FILES` blobs, and fit twice in the free space (packed copy +
import).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from .bundle import BLOB_MEMBER, DOCUMENTS, MANIFEST, SIGNATURE
from .bundle_limits import SPACE_MARGIN
from .errors import CacheError

#: Most blob files a tree may hold (a real cache holds thousands).
MAX_TREE_FILES = 200_000


def import_tree(store: Any, root: Path, **options: Any) -> dict[str, Any]:
    """Pack the unpacked bundle at ``root`` and import it into ``store`` (options as import_bundle)."""
    members = _members(root)
    needed = sum(size for _, size in members)
    free = shutil.disk_usage(store.path).free
    if 2 * needed + SPACE_MARGIN > free:
        raise CacheError(f"not enough free space in {store.path} to import {root} ({needed / 2**20:.1f} MiB, needed "
                         f"twice: packed, then stored; {free / 2**20:.1f} MiB free); nothing was imported")
    fd, tmp = tempfile.mkstemp(prefix=".ctbuild-tree-", suffix=".tar", dir=store.path)
    try:
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
            for name, size in members:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = size, 0o644, 0
                with open(root / name, "rb") as f:
                    tar.addfile(info, f)
        return store.import_bundle(tmp, **options)
    except OSError as exc:
        raise CacheError(f"cannot pack {root} for import ({exc.strerror or exc}); nothing was imported") from None
    finally:
        os.unlink(tmp)


def _members(root: Path) -> list[tuple[str, int]]:
    """(name, size) of the tree's files in the bundle's member order; refuses anything else."""
    if not (root / MANIFEST).is_file():
        raise CacheError(f"{root} holds no {MANIFEST}: not an unpacked ctbuild bundle or cache image")
    top: dict[str, int] = {}
    blobs: list[tuple[str, int]] = []
    for entry in os.scandir(root):
        if entry.name == "blobs" and entry.is_dir(follow_symlinks=False):
            blobs = _blobs(root / "blobs")
        elif entry.name in (MANIFEST, SIGNATURE, *DOCUMENTS) and entry.is_file(follow_symlinks=False):
            top[entry.name] = entry.stat(follow_symlinks=False).st_size
        else:
            raise CacheError(f"{root / entry.name} is not part of a bundle (or is a link): refusing {root}; "
                             "nothing was imported")
    ordered = [(name, top[name]) for name in (MANIFEST, *DOCUMENTS) if name in top]
    return ordered + blobs + ([(SIGNATURE, top[SIGNATURE])] if SIGNATURE in top else [])


def _blobs(directory: Path) -> list[tuple[str, int]]:
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            name = f"blobs/{entry.name}"
            if not BLOB_MEMBER.fullmatch(name) or not entry.is_file(follow_symlinks=False):
                raise CacheError(f"{directory / entry.name} is not a bundle blob (a file named by its digest): "
                                 "refusing the tree; nothing was imported")
            found.append((name, entry.stat(follow_symlinks=False).st_size))
            if len(found) > MAX_TREE_FILES:
                raise CacheError(f"{directory} holds more than {MAX_TREE_FILES} files: refusing the tree; "
                                 "nothing was imported")
    return sorted(found)
