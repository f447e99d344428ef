"""Environment hygiene for worker processes: the caller names what to strip and what to set.

The farm itself knows no toolchain: the caller passes the variables that must not leak from a
node's environment into its compiles (``FarmOptions.strip_env``) and the ones to set
(``FarmOptions.env``).
"""
from __future__ import annotations

import os

#: Set in every worker process to its slot name ("w0", "w1", ...); absent in the driver.
WORKER_ENV = "FARM_WORKER"


def clean_worker_env(slot: str, strip: tuple[str, ...] = (),
                     extra: dict[str, str] | None = None) -> dict[str, str]:
    """Strip ``strip`` from os.environ, set ``extra`` and ``FARM_WORKER``; return what was removed."""
    removed = {k: os.environ.pop(k) for k in strip if k in os.environ}
    for k, v in (extra or {}).items():
        os.environ[k] = v
    os.environ[WORKER_ENV] = slot
    return removed
