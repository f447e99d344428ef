"""Checking a cached CUBIN's TileIR before a serving process first loads it.

On the first load of a compile entry in a process, cuTile's front end derives the TileIR of the
kernel as this process has it (`ctbuild.tileir`, no tileiras; the bytecode version comes from
the recorded toolchain profile) and compares its digest with the one recorded when the CUBIN
was compiled. On a mismatch the CUBIN is not served (the call falls to the next signature
class, then to the miss policy) and a warning names the kernel.

Two kinds of kernel are checked:

- **Marked kernels, always.** A kernel whose compiled code depends on what its fingerprint
  cannot follow (an environment variable or a file ``static_eval`` reads, a computed
  ``getattr``: `ctbuild.fingerprint.by_tileir`) has its identity in its TileIR alone. Each of
  its entries is checked at its first load in every serving process (preload does it on its
  thread); one without a recorded digest is not served.
- **Every kernel, with ``CTBUILD_VERIFY=ir``**, for deployments that want the guarantee for
  kernels the fingerprint covers too (an entry without a digest is then served, unverified).

A kernel the fingerprint covers keeps the fast path: no front end, one dictionary lookup on the
first load of each entry. The first check imports cuTile's compiler (~0.3 s); each costs ~10 ms.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..fingerprint import by_tileir
from ..records import CompileMeta, RecordFormatError
from .kernel_store import KernelStore

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from ..identity_reads import ByTileIR
    from ..space import Config

log = logging.getLogger("ctbuild.runtime")


class IrVerifier:
    """Says, once per compile entry and process, whether an entry may be served: for a marked
    kernel (or every kernel, ``every``), whether its recorded TileIR is what these sources
    compile to."""

    def __init__(self, store: KernelStore | None, toolchain_fp: str | None,
                 every: bool = False) -> None:
        self.store, self.toolchain_fp, self.every = store, toolchain_fp, every
        self._version: str | None | bool = False  # False: the profile not read yet
        self._checked: dict[str, bool] = {}
        self._lock = threading.Lock()

    @property
    def bytecode_version(self) -> str | None:
        """The TileIR bytecode version the cache's toolchain profile records (None: ask
        tileiras), read at the first check."""
        if self._version is False:
            profile = self.store.toolchains().get(self.toolchain_fp) \
                if self.store is not None and self.toolchain_fp else None
            version = profile.get("bytecode_version") if isinstance(profile, dict) else None
            self._version = version if isinstance(version, str) else None
        return self._version  # type: ignore[return-value]

    def __call__(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str, key: str,
                 meta: dict[str, Any]) -> bool:
        """Whether the entry ``key`` (``meta``) may be served for ``signature``."""
        marks = by_tileir(tuned)
        if marks is None and not self.every:
            return True
        with self._lock:
            known = self._checked.get(key)
        if known is None:
            known = self._check(tuned, cfg, signature, arch, key, meta, marks)
            with self._lock:
                self._checked[key] = known
        return known

    def digest(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str) -> str:
        """The TileIR digest these sources give for one (kernel, config, signature, arch)."""
        from ..tileir import digest
        return digest(tuned, cfg, signature, arch, self.bytecode_version)

    def _check(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str, key: str,
               meta: dict[str, Any], marks: ByTileIR | None) -> bool:
        from ..tileir import TILEIR_FORMAT
        try:
            recorded, fmt = CompileMeta.from_json(meta).tileir_digest
        except RecordFormatError:
            recorded, fmt = None, 0
        where = f"kernel {tuned.name!r} config {json.dumps(cfg.to_json())} {arch}"
        if recorded is None or fmt != TILEIR_FORMAT:
            if marks is not None:
                log.warning("ctbuild: %s: %s, and cached CUBIN %s has no TileIR digest this "
                            "ctbuild derives: not serving it. Run `ctbuild precompile` to "
                            "rebuild it", where, marks.note, key[:16])
                return False
            log.info("ctbuild: %s: CUBIN %s has no TileIR digest this ctbuild derives; "
                     "served unverified", where, key[:16])
            return True
        try:
            now = self.digest(tuned, cfg, signature, arch)
        except Exception as exc:  # noqa: BLE001 - the front end refusing these sources
            now = f"an error ({type(exc).__name__}: {exc})"
        if now == recorded:
            return True
        found = f"recorded TileIR {recorded[:16]}, now {now[:16] if len(now) == 32 else now}"
        if marks is not None:
            log.warning("ctbuild: %s: %s, and cached CUBIN %s was built from other code than "
                        "this process compiles (%s): not serving it. Rebuild it with `ctbuild "
                        "precompile` where the service's environment and files are",
                        where, marks.note, key[:16], found)
        else:
            log.warning("ctbuild: %s: cached CUBIN %s was built from other code than these "
                        "sources compile to (%s), but its fingerprint did not change: a "
                        "fingerprint hole; not serving it. Run `ctbuild precompile` to rebuild "
                        "it, and please report the edit that caused it", where, key[:16], found)
        return False
