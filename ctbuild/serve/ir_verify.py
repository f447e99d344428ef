"""``CTBUILD_VERIFY=ir``: check a cached CUBIN's TileIR before a serving process first loads it.

For deployments that want the guarantee at run time too: on the first load of each compile
entry, cuTile's front end derives the TileIR of the kernel as this process has it
(`ctbuild.tileir`, no tileiras; the bytecode version comes from the recorded toolchain
profile) and compares its digest with the one recorded when the CUBIN was compiled. A
mismatch means the kernel fingerprint missed an edit (a hole): the CUBIN is not served (the
call falls to the next signature class, then to the miss policy) and a warning names the
kernel. Off by default: the first load of each entry then costs ~10 ms of front end, and the
first check imports cuTile's compiler (~0.3 s). Entries without a recorded digest (older
caches, runtime JIT write-backs) are unverifiable and served.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..records import CompileMeta, RecordFormatError
from .kernel_store import KernelStore

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from ..space import Config

log = logging.getLogger("ctbuild.runtime")


class IrVerifier:
    """Says, once per compile entry and process, whether an entry's recorded TileIR is what
    these sources compile to."""

    def __init__(self, store: KernelStore | None, toolchain_fp: str | None) -> None:
        profile = store.toolchains().get(toolchain_fp) if store is not None and toolchain_fp \
            else None
        version = profile.get("bytecode_version") if isinstance(profile, dict) else None
        self.bytecode_version = version if isinstance(version, str) else None
        self._checked: dict[str, bool] = {}
        self._lock = threading.Lock()

    def __call__(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str, key: str,
                 meta: dict[str, Any]) -> bool:
        """Whether the entry ``key`` (``meta``) may be served for ``signature``."""
        with self._lock:
            known = self._checked.get(key)
        if known is None:
            known = self._check(tuned, cfg, signature, arch, key, meta)
            with self._lock:
                self._checked[key] = known
        return known

    def _check(self, tuned: TunedKernel, cfg: Config, signature: Any, arch: str, key: str,
               meta: dict[str, Any]) -> bool:
        from ..tileir import TILEIR_FORMAT, digest
        try:
            recorded, fmt = CompileMeta.from_json(meta).tileir_digest
        except RecordFormatError:
            recorded, fmt = None, 0
        where = f"kernel {tuned.name!r} config {json.dumps(cfg.to_json())} {arch}"
        if recorded is None or fmt != TILEIR_FORMAT:
            log.info("ctbuild: %s: CUBIN %s has no TileIR digest this ctbuild derives; "
                     "served unverified", where, key[:16])
            return True
        try:
            now = digest(tuned, cfg, signature, arch, self.bytecode_version)
        except Exception as exc:  # noqa: BLE001 - the front end refusing these sources
            now = f"an error ({type(exc).__name__}: {exc})"
        if now == recorded:
            return True
        log.warning("ctbuild: %s: cached CUBIN %s was built from other code than these sources "
                    "compile to (recorded TileIR %s, now %s), but its fingerprint did not "
                    "change: a fingerprint hole; not serving it. Run `ctbuild precompile` to "
                    "rebuild it, and please report the edit that caused it",
                    where, key[:16], recorded[:16], now[:16] if len(now) == 32 else now)
        return False
