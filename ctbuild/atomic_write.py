"""Writing a JSON report whole or not at all.

A report another program reads (``precompile --report``, ``tune --report``, ``CTBUILD_LEDGER``)
goes through `ctbuild.cache.user_files`, the one writer of files a user names: a temporary file
beside it renamed over it (a process killed mid-write leaves the previous file or none, never a
truncated one), a symlink followed to its target, and a device node, FIFO or directory refused
(`NotAFileError`, one line naming the path) rather than replaced."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path``, atomically (see the module doc)."""
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_text(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8) as the whole of ``path``, atomically (see the module doc).
    Imported here, not at module level: the serving process imports this module with its
    ledger and writes only when ``CTBUILD_LEDGER`` is set."""
    from .cache.user_files import write_file
    write_file(path, text.encode("utf-8"))


def check_writable(path: Path | str) -> Path:
    """The file ``path`` will be written to (a symlink's target), checked before the work that
    makes it: a refused report path fails at once, not after the build (`NotAFileError`)."""
    from .cache.user_files import file_target
    return file_target(path)[0]
