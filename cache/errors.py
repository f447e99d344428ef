"""Exceptions of the cache package.

Everything the cache raises on purpose derives from :class:`CacheError`, so callers (the runtime,
the farm, the CLI) can tell "the cache is unusable or was misused" apart from bugs.
"""


class CacheError(Exception):
    """The cache cannot do what was asked (bad bundle, unknown layout, unwritable directory, ...)."""


class ReadOnlyCacheError(CacheError):
    """A write was attempted on a cache opened read-only (explicitly or because its dir is not writable)."""


class UnsafeValueError(CacheError):
    """A stored value or key is not plain bytes/JSON text (e.g. a pickle planted by another tool).

    Raised by the read path *instead of* deserialising it: a shared cache must never execute what
    someone else wrote into it.
    """


class DamagedCacheError(CacheError):
    """The cache's index (an SQLite file) or a value file cannot be read: disk damage, a torn copy.

    The store catches it on every read and treats the lookup as a miss (see ``Store.damage``);
    ``ctbuild cache verify --repair`` rebuilds the index from what is still readable.
    """


class PermissionDeniedError(CacheError):
    """A cache file or directory cannot be read or written by this user (EACCES, EPERM).

    Not damage: the bytes may be intact. Reads treat it as a miss; ``verify`` reports it and
    ``--repair`` never removes what it could not read.
    """


#: What to do about a `PermissionDeniedError`, in every message that reports one.
PERMISSION_HINT = "permission denied: fix ownership or run as the cache's owner"
