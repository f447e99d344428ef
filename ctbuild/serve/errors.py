"""Errors of a kernel call carry the kernel's name: a service calling many kernels must see which
one failed, in the first words of the message."""
from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from .miss_policy import CacheMissError

if TYPE_CHECKING:
    from ..declare import TunedKernel


class KernelCallError(RuntimeError):
    """A call of a declared kernel failed; the message names the kernel first."""


def reraise_named(exc: Exception, tuned: TunedKernel) -> NoReturn:
    """Raise ``exc`` with the kernel's name in front (its type kept where possible), chained to
    the original; as it is when it names the kernel already or is a `CacheMissError`."""
    named = _named(exc, tuned)
    if named is exc:
        raise exc
    raise named from exc


def _named(exc: Exception, tuned: TunedKernel) -> Exception:
    prefix = f"kernel {tuned.name!r}"
    text = str(exc)
    if text.startswith(prefix) or isinstance(exc, CacheMissError):
        return exc
    message = f"{prefix} ({tuned.module}): {type(exc).__name__}: {text}"
    try:
        if len(exc.args) == 1 and isinstance(exc.args[0], str):
            new = type(exc)(message)
            if str(new) == message:
                return new
    except Exception:  # an exception type that cannot be rebuilt from a message
        pass
    return KernelCallError(message)
