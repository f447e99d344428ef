"""Time limits on talking to a registry: a per-read timeout and an overall deadline.

A socket timeout bounds each read, not the transfer: a registry (or a proxy) that sends a byte
every few seconds keeps every read short and a pull alive for ever. So besides the per-read
timeout (``--read-timeout``, the sockets' own timeout), a transfer has a deadline
(``--timeout``), counted from the first request (a push's export and compression before it are
local work): a timer thread that, when it fires, shuts down every socket the transfer opened,
so a read or write blocked in the kernel returns at once. Whatever error that read then raises
is reported as the deadline, in one line.
"""

from __future__ import annotations

import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import CacheError
from . import DEFAULT_READ_TIMEOUT_S

if TYPE_CHECKING:
    from http.client import HTTPConnection


class Deadline:
    """The time limits of one push or pull; leaving it as a context stops its timer.
    ``total_s`` None: no overall deadline, only the per-read timeout."""

    def __init__(self, total_s: float | None = None, read_s: float = DEFAULT_READ_TIMEOUT_S,
                 where: str = "the registry") -> None:
        self.total_s, self.read_s, self.where = total_s, read_s, where
        self.end: float | None = None
        self.expired = False
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Deadline:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def socket_timeout(self) -> float:
        """The timeout of a new connection's sockets: the per-read one, or what is left if less;
        raises the deadline's error once it has passed. The first call starts the clock."""
        if self.total_s is not None and self._timer is None:
            self.end = time.monotonic() + self.total_s
            self._timer = threading.Timer(self.total_s, self._expire)
            self._timer.daemon = True
            self._timer.start()
        left = None if self.end is None else self.end - time.monotonic()
        if self.expired or (left is not None and left <= 0):
            raise self.error()
        return self.read_s if left is None else min(self.read_s, left)

    def connection(self, http_class: Callable[..., HTTPConnection]) -> Callable[..., HTTPConnection]:
        """``http_class`` whose connections register their socket here once connected (urllib
        drops its own reference when the response starts; the response keeps the socket)."""
        def make(host: str, **kwargs: Any) -> HTTPConnection:
            conn = http_class(host, **kwargs)
            connect = conn.connect

            def connect_and_track() -> None:
                connect()
                self._track(conn.sock)
            conn.connect = connect_and_track  # type: ignore[method-assign]
            return conn
        return make

    def explain(self, exc: BaseException, doing: str) -> CacheError | None:
        """The one line to report for ``exc``, raised while ``doing`` something: the deadline
        once it passed (a shut socket fails in many ways), a socket timeout as the per-read
        timeout; None: ``exc`` says it best."""
        if self.expired:
            return self.error()
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            return CacheError(f"{self.where} sent nothing for {self.read_s:g} s while {doing} "
                              "(--read-timeout): retry, check the network, or raise --read-timeout; "
                              "nothing was written")
        return None

    def error(self) -> CacheError:
        return CacheError(f"{self.where} did not finish within --timeout {self.total_s:g} s: check the "
                          "network, or raise --timeout for a large image over a slow link; nothing was written")

    def _track(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.add(sock)
            shut = self.expired
        if shut:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    """Wake whatever blocks on ``sock``: a blocked recv returns, a blocked send fails. The plain
    socket's shutdown, also for TLS (SSLSocket's own drops its TLS state under the reader)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # closed already
        pass
