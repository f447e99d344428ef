"""Writing a file a user named (a report, the ledger, a bundle, a key): whole or not at all, and
never in place of something that is not a file.

One rule for every such writer (``precompile --report``, ``tune --report``, ``CTBUILD_LEDGER``,
``cache export``, ``cache keygen``):

- a path that does not exist, or a regular file: the bytes go to a temporary file beside it,
  renamed over it once complete, so a reader never sees half a file and a killed process
  leaves the old file or none. A replaced file keeps its permission bits.
- a symlink: followed to its final target, to which the same rule applies; the link stays a
  link (a dangling link's target is created).
- anything else (a character or block device such as ``/dev/null``, a FIFO, a socket, a
  directory): refused in one line naming the path, before anything is written. Renaming over a
  device node would replace it with a regular file (as root, ``/dev/null`` itself), and writing
  into a FIFO blocks until someone reads it; a report is a file, so ask for one.

The cache package holds it because ``ctbuild.cache`` may not import the rest of ctbuild, and
both sides write such files; importing it loads neither the store nor diskcache (the serving
process writes its ledger through it).
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from .errors import CacheError

#: A new file's permission bits before the umask (``open()``'s default); keys pass 0o600.
NEW_FILE_MODE = 0o666
KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotAFileError(CacheError):
    """The path names something other than a regular file (or a link to one): not written."""


def file_target(path: str | os.PathLike[str]) -> tuple[Path, os.stat_result | None]:
    """The file a write to ``path`` replaces (``path``, or a link's final target) and its stat
    (None: it does not exist yet); raises NotAFileError for anything but a regular file."""
    given = Path(path)
    target = Path(os.path.realpath(given))
    via = f" (a link to {target})" if str(target) != os.path.abspath(given) else ""
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return target, None
    except OSError as exc:  # a link loop, a parent that is not a directory, no permission
        raise NotAFileError(f"{given}{via}: cannot tell what it is ({exc.strerror}): "
                            "give the path of a regular file") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in KINDS if test(info.st_mode)), "not a regular file")
        raise NotAFileError(f"{given}{via} is {kind}, not a regular file: ctbuild writes only "
                            "regular files; give the path of one (or of a new file)")
    return target, info


@contextmanager
def replacing(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[IO[bytes]]:
    """A binary stream whose bytes replace ``path`` (the module's rule) when the block ends
    without an error; an error leaves ``path`` as it was. ``mode``: the file's permission bits
    (default: a replaced file's own, else ``NEW_FILE_MODE`` less the umask)."""
    target, info = file_target(path)
    tmp = target.with_name(f".{target.name}.{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     NEW_FILE_MODE if mode is None else mode)
    except OSError as exc:  # named by the path asked for, not the temporary name
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as stream:
            if mode is None and info is not None:
                os.fchmod(stream.fileno(), stat.S_IMODE(info.st_mode))
            yield stream
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_file(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` as the whole of ``path`` (see `replacing`)."""
    with replacing(path, mode=mode) as stream:
        stream.write(data)
