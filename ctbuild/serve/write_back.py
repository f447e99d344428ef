"""Writing a CUBIN compiled at run time back into the cache, so the next process serves it.

Only when the cache is writable and this process's toolchain is the one the cache's entries
were built with: anything else would plant a foreign CUBIN under the cache's compile keys.
Never over an entry the key already has: a key holding a CUBIN this process would not serve
(TileIR verification refused it) holds other code than the JIT compiled, and writing this one
under it would serve that code wherever the other sources come back. Each write-back records
the TileIR digest of what it compiled and the call's workload, so every check (a serving
process's, precompile's, ``cache verify --identity``) can verify it like a built entry."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records import CompileMeta
from ..space import Config
from ..tileir import TILEIR_FORMAT
from .ir_verify import IrVerifier
from .kernel_store import KernelStore

if TYPE_CHECKING:
    from ..declare import TunedKernel

log = logging.getLogger("ctbuild.runtime")


class WriteBack:
    """Stores JIT-compiled CUBINs in one cache under its toolchain; counts what it stored."""

    def __init__(self, store: KernelStore | None, toolchain_fp: str | None,
                 cache_dir: Path, verifier: IrVerifier) -> None:
        self.store, self.toolchain_fp, self.cache_dir = store, toolchain_fp, cache_dir
        self.verifier = verifier
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
            arch: str, signature: Any, workload: dict[str, Any] | None) -> bool:
        """Store one JIT-compiled CUBIN of ``signature`` (the call's, ``workload`` its spec when
        resolved) when that is safe (see the module doc)."""
        store = self.store
        if store is None or store.readonly or self.toolchain_fp is None or workload is None:
            return False  # without its workload no check could verify it later
        if self.local_toolchain() != self.toolchain_fp:
            return False
        try:
            if store.has_compile(key):
                log.info("ctbuild: not writing a JIT CUBIN of %s back under %s: the cache holds "
                         "another CUBIN there, which this process did not serve", tuned.name,
                         key[:16])
                return False
            digest = self.verifier.digest(tuned, cfg, signature, arch)
            store.put_compile(key, cubin, symbol=symbol, meta=CompileMeta(
                kernel=tuned.name, module=tuned.module, kernel_fp=tuned.fingerprint,
                arch=arch, config=cfg.to_json(), workload=workload,
                toolchain=self.toolchain_fp, tileir=digest, tileir_format=TILEIR_FORMAT,
                cls="exact", source="runtime-jit").to_json())
        except Exception as exc:
            log.warning("ctbuild: could not write a JIT CUBIN of %s back to %s: %s",
                        tuned.name, self.cache_dir, exc)
            return False
        with self._lock:
            self.count += 1
        return True
