"""Where in the user's code an exception was raised.

Grid, args and key functions, constraints and kernel modules are user code run by ctbuild; when
one of them raises, the one-line message must point at the user's file and line, not at ctbuild.
"""
from __future__ import annotations

import os
import site
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


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The deepest frame of the traceback in the user's code (not ctbuild, not a library)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>")
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else ""
        if path and not path.startswith(OWN_DIRS) and not path.startswith(LIBRARY_DIRS):
            return frame
    return None


def where(exc: BaseException) -> str:
    """`` (in FILE:LINE, FUNCTION)`` for the user's frame of ``exc``, or an empty string."""
    frame = user_frame(exc)
    return f" (in {frame.filename}:{frame.lineno}, {frame.name})" if frame is not None else ""
