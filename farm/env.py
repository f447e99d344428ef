"""Toolchain hygiene for worker processes.

tileiras uses only ``$CUDA_HOME``'s ptxas/libnvvm when CUDA_HOME is set and it is not the pip
tileiras; an older toolkit there breaks compiles (exit 5). Workers strip these variables so the
pip tileiras with its own ptxas/libnvvm is what runs, whatever the node's environment says.
"""
from __future__ import annotations

import os

#: Removed from every worker's environment before anything is imported or probed.
STRIPPED_ENV = ("CUDA_HOME", "CUDA_PATH")
#: Set in every worker process to its slot name ("w0", "w1", ...); absent in the driver.
WORKER_ENV = "FARM_WORKER"


def clean_worker_env(slot: str, strip: tuple[str, ...] = STRIPPED_ENV,
                     extra: dict[str, str] | None = None) -> dict[str, str]:
    """Strip ``strip`` from os.environ, set ``extra`` and ``FARM_WORKER``; return what was removed."""
    removed = {k: os.environ.pop(k) for k in strip if k in os.environ}
    for k, v in (extra or {}).items():
        os.environ[k] = v
    os.environ[WORKER_ENV] = slot
    return removed
