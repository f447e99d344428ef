"""A registry target: the OCI distribution API over urllib (no client library, no CLI).

What it speaks: manifests and blobs by tag or digest (GET/HEAD/PUT), monolithic blob upload
(POST then PUT), the referrers API where the registry has it, and authentication by challenge: a
401 with ``WWW-Authenticate: Bearer realm=...`` fetches a token (anonymously, or with basic
credentials), ``Basic`` sends the credentials. Credentials come from ``CTBUILD_REGISTRY_USER`` and
``CTBUILD_REGISTRY_PASSWORD``, else from ``docker login`` (``~/.docker/config.json``, ``auth``
entries; credential helpers are not asked). Authorization is never forwarded on a redirect (blob downloads are
often redirected to object storage). ``localhost``/``127.0.0.1`` registries, and ``--plain-http``,
use http.
"""

from __future__ import annotations

import base64
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException, HTTPResponse
from typing import IO, Any

from ..errors import CacheError
from . import MAX_DOCUMENT, OCI_INDEX, OCI_MANIFEST
from .blobs import copy_verified, parse_json, read_capped
from .commands import PASSWORD_ENV, USER_ENV
from .reference import Reference

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
TIMEOUT_S = 60
CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class Registry:
    """One repository of one registry."""

    def __init__(self, ref: Reference, *, plain_http: bool = False, push: bool = False) -> None:
        host = ref.registry.rsplit(":", 1)[0] if not ref.registry.startswith("[") else ref.registry.split("]")[0] + "]"
        scheme = "http" if plain_http or host in LOCAL_HOSTS else "https"
        self.ref = ref
        self.base = f"{scheme}://{ref.registry}/v2/{ref.repository}"
        self.scope = f"repository:{ref.repository}:{'pull,push' if push else 'pull'}"
        user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
        self.credentials = (user, password or "") if user else _docker_login(ref.registry)
        self.auth: str | None = None

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
                response = _OPENER.open(request, timeout=TIMEOUT_S)
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 1 and self._authenticate(exc.headers.get("WWW-Authenticate", "")):
                    if hasattr(data, "seek"):
                        data.seek(0)
                    continue
                if exc.code == 404 and missing_ok:
                    return _Response(None)
                raise CacheError(self._http_error(method, exc)) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise CacheError(f"cannot reach {self.describe()} ({reason}): check the address, the network, "
                                 "or --plain-http for a registry without TLS; nothing was written") from None
            if response.status not in ok:
                response.close()
                raise CacheError(f"{self.describe()} answered {method} {path} with HTTP {response.status}, "
                                 f"expected {ok[0]}; nothing was written")
            return _Response(response)
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
            with _OPENER.open(request, timeout=TIMEOUT_S) as response:
                body = parse_json(read_capped(response, MAX_DOCUMENT, "token response"), "token response")
        except (urllib.error.URLError, OSError) as exc:
            raise CacheError(f"cannot get a token from {params['realm']} ({getattr(exc, 'reason', exc)}); "
                             f"check {USER_ENV}/{PASSWORD_ENV}; nothing was written") from None
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str) or self.auth == f"Bearer {token}":
            return False
        self.auth = f"Bearer {token}"
        return True

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
    """A context manager around a response that may be absent (a tolerated 404); a connection that
    breaks while the body is read becomes one line, not a traceback."""

    def __init__(self, response: HTTPResponse | None) -> None:
        self.response = response

    def __enter__(self) -> Any:
        return self.response

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if self.response is not None:
            self.response.close()
        if exc_type is not None and issubclass(exc_type, HTTPException):
            raise CacheError(f"the connection to the registry broke while reading ({exc_type.__name__}); "
                             "retry; nothing was written") from None


_OPENER = urllib.request.build_opener()
