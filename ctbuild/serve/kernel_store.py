"""What serving needs of a cache: the methods of `ctbuild.cache.Store` the serve phase calls, and no
more (a deployment may pass its own store to `runtime.configure`)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class CachedCubin(Protocol):
    """A verified compile entry (`ctbuild.cache.CompileHit`)."""

    @property
    def cubin(self) -> bytes: ...

    @property
    def symbol(self) -> str: ...


class KernelStore(Protocol):
    """Tuning records and CUBINs by key, the recorded toolchains, damage reports."""
    on_damage: Callable[[str], None] | None

    @property
    def path(self) -> Path: ...

    @property
    def readonly(self) -> bool: ...

    @property
    def damage(self) -> str | None: ...

    def toolchains(self) -> dict[str, dict[str, Any]]: ...

    def get_tuning(self, key: str) -> dict[str, Any] | None: ...

    def has_compile(self, key: str) -> bool: ...

    def get_compile(self, key: str) -> CachedCubin | None: ...

    def put_compile(self, key: str, cubin: bytes, *, symbol: str, meta: dict[str, Any]) -> str: ...
