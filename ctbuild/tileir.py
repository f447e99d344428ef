"""cuTile's front end for one (kernel, config, signature, arch): the TileIR a CUBIN is built
from, and its digest, which every compile entry records.

The front end is cuTile's own Python code (no tileiras): it turns the kernel's source, the
values it reads and the signature into TileIR bytecode. Debug info is anonymized, so the
bytecode holds no file path, line number or column, and is the same from any checkout path and
under any Python version: its digest is a statement about the compiled code alone. The build
(`ctbuild.compile.compiler`) hands this bytecode to tileiras; the identity checks
(`ctbuild.compile.ir_check`, ``ctbuild cache verify --identity``, ``CTBUILD_VERIFY=ir`` in a
serving process) derive it again and compare digests, which needs no kernel fingerprint.

Importing this module is cheap; cuTile's compiler is imported on the first derivation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xxhash

from . import cutile

if TYPE_CHECKING:
    from .declare import TunedKernel
    from .space import Config

#: How the recorded digest is derived (xxh3-128 of the anonymized TileIR bytecode). An entry
#: recorded under another format is unverifiable, never a mismatch.
TILEIR_FORMAT = 1


@dataclass(frozen=True)
class TileIR:
    """cuTile's front-end output for one (kernel, config, signature, arch), its bytecode with
    debug locations removed (so no path or line number is in it), and the bytecode's digest."""
    front_end: cutile.FrontEnd
    digest: str

    @property
    def bytecode(self) -> bytes:
        return self.front_end.bytecode

    @property
    def links_libraries(self) -> bool:
        return bool(self.front_end.lifecycle_providers)


def derive(kernel: TunedKernel, cfg: Config, signature: Any, arch: str,
           bytecode_version: str | None = None) -> TileIR:
    """Run cuTile's front end (what ``compile_tile`` does before tileiras), anonymized.

    ``bytecode_version`` ("13.4", as a toolchain profile records it) saves asking tileiras
    (a serving image may have none); None asks it once per process."""
    from .toolchain import compile_environment

    version = None if bytecode_version is None else cutile.bytecode_version(bytecode_version)
    with cutile.compiler_lock(), compile_environment():
        ir = cutile.front_end(kernel.kernel, signature, arch, kernel.compiler_options(cfg),
                              version)
    return TileIR(ir, xxhash.xxh3_128_hexdigest(ir.bytecode))


def digest(kernel: TunedKernel, cfg: Config, signature: Any, arch: str,
           bytecode_version: str | None = None) -> str:
    """The TileIR digest a compile entry of this (kernel, config, signature, arch) records."""
    return derive(kernel, cfg, signature, arch, bytecode_version).digest


__all__ = ["TILEIR_FORMAT", "TileIR", "derive", "digest"]
