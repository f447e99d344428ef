"""examples/Dockerfile in a real Docker engine, and the build context it is sent.

The context tests run everywhere: they apply the repository's .dockerignore the way the engine
does to a checkout holding a large virtualenv, a cache and a git directory. The ``docker`` tests
need a reachable engine (``$DOCKER_HOST``, /var/run/docker.sock or /tmp/dk/docker.sock, pinged)
and a Python base image that exists in it (``$CTBUILD_TEST_BASE_IMAGE``, default
``local/pybase:bookworm``); they skip otherwise. On a machine without registry access,
``sh tests/docker/local-engine.sh`` starts an engine and builds that image from Debian packages
(docs/deployment.md).
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "examples" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CONTEXT_LIMIT = 20 * 1024 * 1024
BASE_IMAGE = os.environ.get("CTBUILD_TEST_BASE_IMAGE", "local/pybase:bookworm")
SOCKETS = ("/var/run/docker.sock", "/tmp/dk/docker.sock")
CACHE_DIR = "/opt/ctbuild-cache"
ARCHS = "sm_90,sm_100"


# ---- the .dockerignore rules, as the engine applies them -----------------------------------------
def _pattern_regex(pattern: str) -> re.Pattern:
    """Go filepath.Match syntax plus `**` (any number of directories), as in moby's
    patternmatcher."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" : zero or more leading directories
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        c = pattern[i]
        out += "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
        i += 1
    return re.compile(out + r"\Z")


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern]]:
    """(exclude?, regex) per pattern line, in order; later lines win."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((exclude, _pattern_regex(pattern)))
    return rules


def ignored(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether the engine leaves `rel` out: the last rule matching it or one of its parent
    directories decides."""
    parts = rel.split("/")
    parents = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for exclude, regex in rules:
        if any(regex.match(p) for p in parents):
            verdict = exclude
    return verdict


def context_files(root: Path) -> dict[str, int]:
    """The files the engine would send from `root`: relative path -> size (a link is sent as a
    link, never followed: ctbuild/farm and ctbuild/cache)."""
    rules = dockerignore_rules((root / ".dockerignore").read_text())
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if not ignored(rel, rules):
                out[rel] = path.lstat().st_size
    return out


def checkout_with_junk(dest: Path) -> Path:
    """The repository's files (its links as links) plus what a used checkout holds: a 1.8 GB
    virtualenv (sparse), a local cache and a git directory."""
    shutil.copytree(ROOT, dest, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", ".venv", ".ctbuild-cache",
                                                  "__pycache__", ".pytest_cache"))
    site = dest / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    with open(site / "libtorch_cpu.so", "wb") as f:
        f.truncate(1800 * 1024 * 1024)
    for i in range(200):
        (site / f"module_{i}.py").write_text("x = 1\n" * 100)
    (dest / ".ctbuild-cache").mkdir()
    with open(dest / ".ctbuild-cache" / "cache.db", "wb") as f:
        f.truncate(64 * 1024 * 1024)
    (dest / ".git" / "objects").mkdir(parents=True)
    with open(dest / ".git" / "objects" / "pack.pack", "wb") as f:
        f.truncate(300 * 1024 * 1024)
    return dest


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths the Dockerfile's COPY steps read."""
    out = []
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not parts[1].startswith("--from="):
            out += [p.rstrip("/") for p in parts[1:-1]]
    return out


def test_dockerignore_rules_follow_the_engine() -> None:
    rules = dockerignore_rules("*\n!src\nsrc/**/*.pyc\n!keep.txt\n")
    assert ignored("README.md", rules) and ignored(".venv/bin/python", rules)
    assert not ignored("src/a.py", rules) and not ignored("keep.txt", rules)
    assert ignored("src/pkg/__pycache__/a.pyc", rules) and ignored("src/b.pyc", rules)
    rules = dockerignore_rules("**/.venv\n")
    assert ignored(".venv/x", rules) and ignored("examples/.venv/lib/y", rules)
    assert not ignored("venv/x", rules)


def test_context_of_a_checkout_with_a_venv_is_small(tmp_path: Path) -> None:
    checkout = checkout_with_junk(tmp_path / "checkout")
    sent = context_files(checkout)
    total = sum(sent.values())
    assert total < CONTEXT_LIMIT, f"build context {total / 2**20:.1f} MB"
    leaked = [p for p in sent if p.split("/")[0] in (".venv", ".git", ".ctbuild-cache")]
    assert not leaked, leaked[:5]
    assert not [p for p in sent if "__pycache__" in p or p.endswith(".pyc")]
    # ...and everything the Dockerfile copies is still there.
    for src in copy_sources(DOCKERFILE):
        assert src in sent or any(p.startswith(src + "/") for p in sent), f"COPY {src}: ignored"
    assert "examples/build-cache.sh" in sent and "ctbuild/cli.py" in sent
    assert {"ctbuild/farm", "ctbuild/cache"} <= set(sent)  # the links, beside farm/ and cache/


def test_dockerfile_pulls_no_frontend_and_names_bases_by_build_arg() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I), \
        "a `# syntax=` line makes the engine pull a frontend image from a registry"
    stages = set()
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["FROM"]:
            assert parts[1] in stages or re.fullmatch(r"\$\{\w+\}", parts[1]), line
            if len(parts) >= 4 and parts[2].upper() == "AS":
                stages.add(parts[3])


# ---- a real engine ------------------------------------------------------------------------------
class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def _ping(sock_path: str) -> bool:
    try:
        conn = _UnixHTTPConnection(sock_path)
        conn.request("GET", "/_ping")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def _engine_host() -> str | None:
    """A `unix://` address of an engine that answers a ping, or None."""
    host = os.environ.get("DOCKER_HOST", "")
    candidates = [host[len("unix://"):]] if host.startswith("unix://") else []
    candidates += [] if host else list(SOCKETS)
    for path in candidates:
        if Path(path).exists() and _ping(path):
            return f"unix://{path}"
    return None


def _docker_client() -> str | None:
    """A client that builds with BuildKit without the buildx plugin: Debian's /usr/bin/docker
    where present, else the first on PATH."""
    return os.environ.get("CTBUILD_TEST_DOCKER") or (
        "/usr/bin/docker" if Path("/usr/bin/docker").exists() else shutil.which("docker"))


@pytest.fixture(scope="module")
def docker() -> list[str]:
    host, client = _engine_host(), _docker_client()
    if host is None or client is None:
        pytest.skip("no Docker engine reachable ($DOCKER_HOST, /var/run/docker.sock, "
                    "/tmp/dk/docker.sock); see tests/docker/local-engine.sh")
    cmd = [client, "--host", host]
    if subprocess.run([*cmd, "image", "inspect", BASE_IMAGE], capture_output=True).returncode:
        pytest.skip(f"base image {BASE_IMAGE} not in the engine; build it with "
                    "`sh tests/docker/local-engine.sh image` or set CTBUILD_TEST_BASE_IMAGE")
    return cmd


def _docker(cmd: list[str], *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert proc.returncode == 0, (f"docker {' '.join(args[:3])} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def _context_bytes(build_log: str) -> float:
    """The size BuildKit reports for the `context` transfer (`transferring context: 1.2MB`)."""
    units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
    sizes = [float(n) * units[u] for n, u in
             re.findall(r"transferring context: ([\d.]+)(B|kB|MB|GB)", build_log)]
    assert sizes, f"no context transfer in the build log:\n{build_log[-3000:]}"
    return max(sizes)


@pytest.mark.docker
@pytest.mark.slow
def test_build_stage_in_docker_holds_the_planned_cache(docker: list[str], tmp_path: Path
                                                        ) -> None:
    checkout = checkout_with_junk(tmp_path / "checkout")
    tag = f"ctbuild-test-build:{uuid.uuid4().hex[:12]}"
    start = time.monotonic()
    # --pull=false and no registry route needed: the base is local, the frontend built in.
    # --no-cache: every step really runs (pip's cache mount still saves downloads).
    proc = _docker(docker, "build", "--progress=plain", "--pull=false", "--no-cache",
                   "--network=host",
                   "--target", "build", "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}",
                   "--build-arg", f"ARCHS={ARCHS}", "-f", "examples/Dockerfile", "-t", tag,
                   str(checkout))
    elapsed = time.monotonic() - start
    log = proc.stdout + proc.stderr
    try:
        assert _context_bytes(log) < CONTEXT_LIMIT, "the .venv went into the build context"
        assert "docker/dockerfile" not in log, "the build resolved a frontend image"

        # One container (each costs a full copy of the image on the vfs driver): verify the
        # cache, its counts, the plan, and what /tmp holds; sections split by a marker line.
        script = " && echo @@ && ".join([
            f"ctbuild cache verify --cache {CACHE_DIR}",
            f"ctbuild cache stats --cache {CACHE_DIR} --json",
            f"ctbuild plan --config examples/ctbuild.toml --arch {ARCHS} --json",
            "ls -A /tmp"])
        out = _docker(docker, "run", "--rm", "--network=none", tag, "sh", "-c", script,
                      timeout=900).stdout
        sections = out.split("@@\n")
        assert len(sections) == 4, out[-3000:]
        verify, stats, plan = sections[0], json.loads(sections[1]), json.loads(sections[2])
        print(f"docker build of the build stage: {elapsed:.1f} s; {plan['jobs']} jobs; "
              f"verify: {verify.strip()}")
        assert verify.strip().endswith("ok"), verify
        assert plan["jobs"] > 0 and plan["toolchain"] != "unprobed"
        assert stats["compile_entries"] == stats["blobs"] == plan["jobs"], (stats, plan)
        assert stats["toolchains"] == 1
        # Ray's session directory (logs, unix sockets) stayed out of the image
        assert sections[3].strip() == "", sections[3]
        # the precompile step had a /dev/shm large enough for Ray's object store
        assert "is using /tmp instead of /dev/shm" not in log, "Ray's object store left /dev/shm"
    finally:
        subprocess.run([*docker, "image", "rm", "-f", tag], capture_output=True)
