"""A registry target: the OCI distribution API over urllib (no client library, no CLI).

What it speaks: manifests and blobs by tag or digest (GET/HEAD/PUT), monolithic blob upload
(POST then PUT), the referrers API where the registry has it, and authentication by challenge: a
401 with ``WWW-Authenticate: Bearer realm=...`` fetches a token (anonymously, or with basic
credentials), ``Basic`` sends the credentials. Credentials come from ``CTBUILD_REGISTRY_USER`` and
``CTBUILD_REGISTRY_PASSWORD``, else from ``docker login`` (``~/.docker/config.json``, ``auth``
entries; credential helpers are not asked). Authorization is never forwarded on a redirect (blob downloads are
often redirected to object storage). ``localhost``/``127.0.0.1`` registries, and ``--plain-http``,
use http. Every request, body and redirect included, runs under the target's time limits
(:mod:`ctbuild.cache.oci.deadline`: ``--read-timeout`` per read, ``--timeout`` overall).
"""

from __future__ import annotations

import base64
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException, HTTPResponse
from types import TracebackType
from typing import IO, Any

from ..errors import CacheError
from . import DEFAULT_READ_TIMEOUT_S, MAX_DOCUMENT, OCI_INDEX, OCI_MANIFEST
from .blobs import copy_verified, parse_json, read_capped
from .commands import PASSWORD_ENV, USER_ENV
from .deadline import Deadline
from .reference import Reference

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class Registry:
    """One repository of one registry."""

    def __init__(self, ref: Reference, *, plain_http: bool = False, push: bool = False,
                 timeout_s: float | None = None, read_timeout_s: float | None = None) -> None:
        """``timeout_s``: the deadline of everything said to the registry while `deadline` is
        entered (None: none); ``read_timeout_s``: of each connect, read and write (None: the default)."""
        host = ref.registry.rsplit(":", 1)[0] if not ref.registry.startswith("[") else ref.registry.split("]")[0] + "]"
        scheme = "http" if plain_http or host in LOCAL_HOSTS else "https"
        self.ref = ref
        self.base = f"{scheme}://{ref.registry}/v2/{ref.repository}"
        self.scope = f"repository:{ref.repository}:{'pull,push' if push else 'pull'}"
        user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
        self.credentials = (user, password or "") if user else _docker_login(ref.registry)
        self.auth: str | None = None
        self.deadline = Deadline(timeout_s, read_timeout_s or DEFAULT_READ_TIMEOUT_S, self.describe())
        self._opener = urllib.request.build_opener(_HTTPHandler(self.deadline), _HTTPSHandler(self.deadline))

    def describe(self) -> str:
        return f"registry {self.ref.registry}"

    # -- reading -------------------------------------------------------------------------------
    def get_manifest(self, name: str) -> tuple[bytes, str, str | None] | None:
        """The manifest or index ``name`` (tag or digest): its bytes, media type and the digest the
        registry says it has (the caller checks the bytes against it); None if absent."""
        with self._request("GET", f"/manifests/{name}", headers={"Accept": f"{OCI_MANIFEST}, {OCI_INDEX}"},
                           missing_ok=True) as response:
            if response is None:
                return None
            data = read_capped(response, MAX_DOCUMENT, f"manifest {name} from {self.describe()}")
            media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
            return data, media_type, response.headers.get("Docker-Content-Digest")

    def fetch_blob(self, digest: str, size: int, out: IO[bytes], what: str) -> None:
        with self._request("GET", f"/blobs/{digest}") as response:
            copy_verified(response, out, digest, size, what)

    def has_blob(self, digest: str) -> bool:
        with self._request("HEAD", f"/blobs/{digest}", missing_ok=True) as response:
            return response is not None

    def referrers(self, digest: str) -> list[dict[str, Any]] | None:
        """The referrers API's descriptors, or None where the registry has no such API."""
        with self._request("GET", f"/referrers/{digest}", headers={"Accept": OCI_INDEX},
                           missing_ok=True) as response:
            if response is None:
                return None
            index = parse_json(read_capped(response, MAX_DOCUMENT, "referrers index"), "referrers index")
        manifests = index.get("manifests")
        return manifests if isinstance(manifests, list) else []

    # -- writing -------------------------------------------------------------------------------
    def put_blob(self, digest: str, size: int, source: str | bytes) -> None:
        """Upload a blob (from a file path or bytes) unless the registry has it."""
        if self.has_blob(digest):
            return
        with self._request("POST", "/blobs/uploads/", ok=(202,)) as response:
            location = response.headers.get("Location")
        if not location:
            raise CacheError(f"{self.describe()} started an upload without a Location; it does not speak the "
                             "OCI distribution API")
        url = urllib.parse.urljoin(self.base + "/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(source, bytes):
            with self._request("PUT", url, data=source, headers=headers, ok=(201,)):
                pass
            return
        with open(source, "rb") as body, self._request("PUT", url, data=body, headers=headers, ok=(201,)):
            pass

    def put_manifest(self, name: str, data: bytes, media_type: str) -> None:
        with self._request("PUT", f"/manifests/{name}", data=data, headers={"Content-Type": media_type},
                           ok=(201,)):
            pass

    # -- HTTP ----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, headers: dict[str, str] | None = None, data: Any = None,
                 ok: tuple[int, ...] = (200,), missing_ok: bool = False) -> _Response:
        url = path if "://" in path else self.base + path
        for attempt in (1, 2):
            request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
            if self.auth:
                request.add_unredirected_header("Authorization", self.auth)
            try:
                response = self._opener.open(request, timeout=self.deadline.socket_timeout())
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 1 and self._authenticate(exc.headers.get("WWW-Authenticate", "")):
                    if hasattr(data, "seek"):
                        data.seek(0)
                    continue
                if exc.code == 404 and missing_ok:
                    return _Response(None, self.deadline, path)
                raise CacheError(self._http_error(method, exc)) from None
            except (urllib.error.URLError, OSError, HTTPException) as exc:
                raise self._unreachable(exc, f"answering {method} {path}") from None
            if response.status not in ok:
                response.close()
                raise CacheError(f"{self.describe()} answered {method} {path} with HTTP {response.status}, "
                                 f"expected {ok[0]}; nothing was written")
            return _Response(response, self.deadline, f"sending {path}")
        raise AssertionError("unreachable")

    def _authenticate(self, challenge: str) -> bool:
        """Answer a 401's challenge; False if there is nothing more to try."""
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic" and self.credentials:
            self.auth = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
            return True
        if scheme != "bearer":
            return False
        params = dict(CHALLENGE_PARAM.findall(challenge))
        if "realm" not in params:
            return False
        query = {"scope": params.get("scope", self.scope)}
        if "service" in params:
            query["service"] = params["service"]
        request = urllib.request.Request(params["realm"] + "?" + urllib.parse.urlencode(query))
        if self.credentials:
            request.add_unredirected_header(
                "Authorization", "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode())
        try:
            with self._opener.open(request, timeout=self.deadline.socket_timeout()) as response:
                body = parse_json(read_capped(response, MAX_DOCUMENT, "token response"), "token response")
        except (urllib.error.URLError, OSError, HTTPException) as exc:
            raise (self.deadline.explain(exc, "sending a token") or CacheError(
                f"cannot get a token from {params['realm']} ({getattr(exc, 'reason', exc)}); "
                f"check {USER_ENV}/{PASSWORD_ENV}; nothing was written")) from None
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str) or self.auth == f"Bearer {token}":
            return False
        self.auth = f"Bearer {token}"
        return True

    def _unreachable(self, exc: BaseException, doing: str) -> CacheError:
        """Why a request got no answer: the time limits, else the network."""
        return self.deadline.explain(exc, doing) or CacheError(
            f"cannot reach {self.describe()} ({getattr(exc, 'reason', exc)}): check the address, the network, "
            "or --plain-http for a registry without TLS; nothing was written")

    def _http_error(self, method: str, exc: urllib.error.HTTPError) -> str:
        try:
            detail = exc.read(4096).decode("utf-8", "replace")
            errors = parse_json(detail.encode(), "error").get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
        except (CacheError, OSError, ValueError):
            detail = ""
        what = f"{self.describe()} refused {method} {self.ref.repository} with HTTP {exc.code}"
        what += f" ({detail[:200]})" if detail else ""
        if exc.code == 401:
            return f"{what}: not authorized; set {USER_ENV} and {PASSWORD_ENV}; nothing was written"
        if exc.code == 404:
            return f"{what}: {self.ref} not found; check the name and tag; nothing was written"
        return f"{what}; nothing was written"


def _docker_login(registry: str) -> tuple[str, str] | None:
    """Credentials `docker login` stored for ``registry`` (``auths.<host>.auth``, base64 user:password)."""
    path = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json")
    try:
        with open(path, "rb") as f:
            auths = parse_json(read_capped(f, MAX_DOCUMENT, path), path).get("auths") or {}
        entry = auths.get(registry) or auths.get(f"https://{registry}") or {}
        user, _, password = base64.b64decode(entry.get("auth", "")).decode().partition(":")
    except (OSError, CacheError, ValueError, AttributeError):
        return None
    return (user, password) if user else None


class _Response:
    """A context manager around a response that may be absent (a tolerated 404): an error while
    its body is read (a broken connection, a time limit) becomes one line, not a traceback."""

    def __init__(self, response: HTTPResponse | None, deadline: Deadline, doing: str) -> None:
        self.response, self.deadline, self.doing = response, deadline, doing

    def __enter__(self) -> Any:
        return self.response

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.response is not None:
            self.response.close()
        if exc is None and self.deadline.expired:  # a body cut short by the deadline can look whole
            raise self.deadline.error()
        if exc is None:
            return
        if explained := self.deadline.explain(exc, self.doing):
            raise explained from None
        if isinstance(exc, HTTPException):
            raise CacheError(f"the connection to the registry broke while reading ({type(exc).__name__}); "
                             "retry; nothing was written") from None


class _UnderDeadline(urllib.request.AbstractHTTPHandler):
    """A urllib handler whose every connection's socket is registered with the deadline (mixed
    into the http and the https handler)."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(self.deadline.connection(http_class), req, **kwargs)


class _HTTPHandler(_UnderDeadline, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_UnderDeadline, urllib.request.HTTPSHandler):
    pass
