"""Writing a JSON report whole or not at all.

A report another program reads (``--report``, ``--json-out``, ``CTBUILD_LEDGER``) is written to a
temporary file beside it and renamed over it: a process killed mid-write leaves the previous
file or none, never a truncated one that parses as garbage or not at all."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path``, atomically (see the module doc)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
