"""Writing a CUBIN compiled at run time back into the cache, so the next process serves it.

Only when the cache is writable and this process's toolchain is the one the cache's entries
were built with: anything else would plant a foreign CUBIN under the cache's compile keys."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..records import CompileMeta
from ..space import Config
from .kernel_store import KernelStore

if TYPE_CHECKING:
    from ..declare import TunedKernel

log = logging.getLogger("ctbuild.runtime")


class WriteBack:
    """Stores JIT-compiled CUBINs in one cache under its toolchain; counts what it stored."""

    def __init__(self, store: KernelStore | None, toolchain_fp: str | None,
                 cache_dir: Path) -> None:
        self.store, self.toolchain_fp, self.cache_dir = store, toolchain_fp, cache_dir
        self.count = 0
        self._local_fp: str | None | bool = False  # False: not probed yet
        self._lock = threading.Lock()

    @property
    def writable(self) -> bool:
        return self.store is not None and not self.store.readonly

    def local_toolchain(self) -> str | None:
        """This process's toolchain fingerprint (probed once; None when there is none)."""
        if self._local_fp is False:
            from ..toolchain import ToolchainError, probe
            try:
                self._local_fp = probe().fingerprint
            except (ToolchainError, OSError) as exc:
                log.info("ctbuild: no local toolchain to write JIT results back (%s)", exc)
                self._local_fp = None
        return self._local_fp  # type: ignore[return-value]

    def put(self, tuned: TunedKernel, cfg: Config, key: str, cubin: bytes, symbol: str,
            arch: str) -> bool:
        """Store one JIT-compiled CUBIN when that is safe (see the module doc)."""
        store = self.store
        if store is None or store.readonly or self.toolchain_fp is None:
            return False
        if self.local_toolchain() != self.toolchain_fp:
            return False
        try:
            store.put_compile(key, cubin, symbol=symbol, meta=CompileMeta(
                kernel=tuned.name, module=tuned.module, kernel_fp=tuned.fingerprint,
                arch=arch, config=cfg.to_json(), toolchain=self.toolchain_fp,
                source="runtime-jit").to_json())
        except Exception as exc:
            log.warning("ctbuild: could not write a JIT CUBIN of %s back to %s: %s",
                        tuned.name, self.cache_dir, exc)
            return False
        with self._lock:
            self.count += 1
        return True
