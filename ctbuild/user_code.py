"""Where in the user's code an exception was raised.

Grid, args and key functions, constraints and kernel modules are user code run by ctbuild; when
one of them raises, the one-line message must point at the user's file and line, not at ctbuild.
"""
from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import traceback
from pathlib import Path

#: Our own package, and where its farm and cache really live (in a source tree ctbuild/farm and
#: ctbuild/cache are links to the top-level farm/ and cache/): frames there are never the user's.
OWN_DIRS = tuple(sorted({str((Path(__file__).parent / name).resolve()) + os.sep
                         for name in ("", "cache", "farm")}))
#: The interpreter's and installed libraries' directories (a distribution's dist-packages too).
LIBRARY_DIRS = tuple(sorted({str(Path(p).resolve()) + os.sep for p in (
    *(p for key, p in sysconfig.get_paths().items()
      if key in ("stdlib", "platstdlib", "purelib", "platlib")),
    *getattr(site, "getsitepackages", list)(),
    *([site.getusersitepackages()] if site.ENABLE_USER_SITE else []))}))

#: The most of a distribution's RECORD read (a hostile or odd install cannot make this costly).
_RECORD_LIMIT = 1 << 20


@functools.lru_cache(maxsize=64)
def _installed_names(entry: str) -> frozenset[str]:
    """Top-level names the distributions installed in the directory ``entry`` own, from each
    ``*.dist-info/RECORD``: what ``pip install --target DIR`` put on a ``PYTHONPATH``."""
    try:
        listing = os.listdir(entry)
    except OSError:
        return frozenset()
    names: set[str] = set()
    for info in listing:
        if not info.endswith(".dist-info"):
            continue
        try:
            with open(os.path.join(entry, info, "RECORD"), encoding="utf-8") as f:
                record = f.read(_RECORD_LIMIT)
        except (OSError, UnicodeDecodeError):
            continue
        for row in record.splitlines():
            top = row.split(",", 1)[0].split("/", 1)[0]
            if top and not top.endswith((".dist-info", ".data")) and top != "..":
                names.add(top)
    return frozenset(names)


def installed_file(real: str) -> bool:
    """Whether the resolved file path ``real`` belongs to a distribution installed in a
    ``sys.path`` directory that is not a site directory (a ``pip install --target`` tree):
    a library by where it lives, like site-packages, so a build and a serving image that put
    cuda-tile in different places give the same kernel fingerprints."""
    for entry in sys.path:
        if not entry:
            continue
        root = str(Path(entry).resolve()) + os.sep
        if real.startswith(root):
            top = real[len(root):].split(os.sep, 1)[0]
            if top.endswith(".py"):
                top = top[:-3]
            if top in _installed_names(root):
                return True
    return False


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The deepest frame of the traceback in the user's code (not ctbuild, not a library)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>")
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else ""
        if path and not path.startswith(OWN_DIRS) and not path.startswith(LIBRARY_DIRS) \
                and not installed_file(path):
            return frame
    return None


def where(exc: BaseException) -> str:
    """`` (in FILE:LINE, FUNCTION)`` for the user's frame of ``exc``, or an empty string."""
    frame = user_frame(exc)
    return f" (in {frame.filename}:{frame.lineno}, {frame.name})" if frame is not None else ""
