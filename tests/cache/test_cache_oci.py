"""The cache as an OCI image, against a real CNCF distribution registry (Debian's docker-registry)
started on a free port, with skopeo as the independent client: push, inspect, copy, pull,
signatures, tampering and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.cache.__main__ import main as cache_main
from ctbuild.cache.oci.layout import Layout
from ctbuild.cache.oci.reference import parse_reference
from ctbuild.cache.oci.referrers import fallback_tag
from ctbuild.cache.oci.registry import Registry

INSTALL = "apt-get update && apt-get install -y docker-registry skopeo"
needs_registry = pytest.mark.skipif(shutil.which("docker-registry") is None,
                                    reason=f"needs Debian's docker-registry: {INSTALL}")
needs_skopeo = pytest.mark.skipif(shutil.which("skopeo") is None, reason=f"needs skopeo: {INSTALL}")
LABEL = "cache.ctbuild.image"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_registry(root: Path, auth: str = "") -> tuple[subprocess.Popen, str]:
    """docker-registry on a free port, storing under ``root``; returns (process, host:port)."""
    port = free_port()
    config = root / "config.yml"
    root.mkdir(parents=True, exist_ok=True)
    config.write_text(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                      f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n{auth}")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
            break
        except urllib.error.HTTPError:
            break  # up, asking for authentication
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("docker-registry did not start")
            time.sleep(0.05)
    return proc, f"localhost:{port}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if shutil.which("docker-registry") is None:
        pytest.skip(f"needs Debian's docker-registry: {INSTALL}")
    root = tmp_path_factory.mktemp("registry")
    proc, host = start_registry(root)
    yield host, root
    proc.terminate()
    proc.wait(timeout=10)


def cubin(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (300 + 11 * i)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A cache of two archs written straight into a Store (no compiler needed)."""
    path = tmp_path_factory.mktemp("src") / "cache"
    with Store(path) as store:
        for i in range(8):
            store.put_compile(f"k{i}", cubin(i), symbol=f"s{i}", meta={
                "kernel": f"kern{i % 3}", "arch": ("sm_90", "sm_100")[i % 2], "config": {"i": i}, "toolchain": "tc1"})
        store.put_tuning("t0", {"kernel": "kern0", "arch": "sm_90", "compile_key": "k0"})
        store.put_toolchain("tc1", {"cuda_tile": "1.7.0", "env": {}})
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    from ctbuild.cache.signing import keygen
    root = tmp_path_factory.mktemp("keys")
    keygen(root / "ci.pem", root / "ci.pub.pem")
    keygen(root / "other.pem", root / "other.pub.pem")
    return {"private": root / "ci.pem", "public": root / "ci.pub.pem", "other": root / "other.pub.pem"}


@pytest.fixture(scope="module")
def pushed(registry, source, keys) -> dict:
    """The source cache pushed signed (sequence 3) as :v1, and unsigned as :unsigned."""
    host, _ = registry
    code, out, err = cli("push", "--cache", str(source), "--sign", str(keys["private"]), "--sequence", "3",
                         "--json", f"{host}/kernels:v1")
    assert code == 0, err
    assert cli("push", "--cache", str(source), f"{host}/kernels:unsigned")[0] == 0
    return json.loads(out)


def cli(*args: str) -> tuple[int, str, str]:
    """`python -m ctbuild.cache ARGS` in this process (the same code as `ctbuild cache`)."""
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cache_main(list(args))
    return code, out.getvalue(), err.getvalue()


def contents(path: Path) -> tuple:
    with Store(path, readonly=True) as store:
        compiles = {k: (e, store.get_compile(k).cubin) for k, e in store.compile_entries()}
        return compiles, dict(store.tuning_records()), store.toolchains()


def refused(args: list[str], message: str, dst: Path) -> None:
    code, out, err = cli(*args)
    assert code == 2 and message in err, (code, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not dst.exists(), "a refused pull wrote the cache"


@needs_skopeo
def test_skopeo_sees_the_labels_and_layer_and_a_pull_equals_the_source(registry, source, pushed, keys, tmp_path):
    host, _ = registry
    inspect = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{host}/kernels:v1"],
                                        capture_output=True, text=True, check=True).stdout)
    assert inspect["Digest"] == pushed["digest"]
    assert inspect["Labels"] == pushed["labels"]
    assert inspect["Layers"] == [pushed["layer"]["digest"]]
    labels = inspect["Labels"]
    assert labels[f"{LABEL}/archs"] == "sm_100,sm_90" and labels[f"{LABEL}/entry-count"] == "8"
    assert labels[f"{LABEL}/cuda-tile-version"] == "1.7.0" and labels[f"{LABEL}/toolchain-fingerprints"] == "tc1"
    assert labels[f"{LABEL}/kernel-count"] == "3" and labels["io.kserve.km/framework"] == "ctbuild"

    copied = tmp_path / "copied"
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{host}/kernels:v1", f"dir:{copied}"],
                   capture_output=True, check=True)
    manifest = json.loads((copied / "manifest.json").read_text())
    layer = manifest["layers"][0]["digest"]
    assert layer == pushed["layer"]["digest"]
    assert "sha256:" + hashlib.sha256((copied / layer.split(":")[1]).read_bytes()).hexdigest() == layer
    config = json.loads((copied / manifest["config"]["digest"].split(":")[1]).read_text())
    assert config["config"]["Labels"] == pushed["labels"]

    dst = tmp_path / "dst"
    code, out, err = cli("pull", f"{host}/kernels:v1", "--cache", str(dst), "--arch", "sm_90",
                         "--require-signature", "--key", str(keys["public"]), "--min-sequence", "3", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["signed"] and result["sequence"] == 3 and result["digest"] == pushed["digest"]
    assert contents(dst) == contents(source)
    with Store(dst) as store:
        assert store.verify()["ok"]


def test_tampered_layer_manifest_and_signature_are_refused(registry, pushed, keys, tmp_path):
    host, base = registry
    pull = ["pull", "--cache", str(tmp_path / "dst"), "--arch", "sm_90", "--require-signature",
            "--key", str(keys["public"])]
    dst = tmp_path / "dst"
    refused([*pull, f"{host}/kernels:v1", "--min-sequence", "4"], "below --min-sequence 4", dst)
    refused(["pull", "--cache", str(dst), "--arch", "sm_90", "--require-signature", "--key", str(keys["other"]),
             f"{host}/kernels:v1"], "wrong key", dst)
    refused([*pull, f"{host}/kernels:unsigned"], "is not signed", dst)

    # A signature whose statement was edited after signing (here: a higher sequence).
    reg = Registry(parse_reference(f"{host}/kernels:v1"), push=True)
    from ctbuild.cache.oci.referrers import attach_signature, read_signature, signature_entries
    document = read_signature(reg, signature_entries(reg, pushed["digest"])[0])
    forged = {**document, "statement": {**document["statement"], "sequence": 99}}
    copy = Registry(parse_reference(f"{host}/forged:v1"), push=True)
    copy_image(reg, copy, pushed["digest"])
    attach_signature(copy, {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": pushed["digest"],
                            "size": len(reg.get_manifest(pushed["digest"])[0])}, forged)
    refused([*pull, f"{host}/forged:v1"], "changed after signing", dst)

    # The manifest of another push (other content) under the signed image's signature.
    other = Registry(parse_reference(f"{host}/kernels:sm90"), push=True)
    assert cli("push", "--cache", str(registry_source(tmp_path)), f"{host}/kernels:sm90")[0] == 0
    other_digest = "sha256:" + hashlib.sha256(other.get_manifest("sm90")[0]).hexdigest()
    index = reg.get_manifest(fallback_tag(pushed["digest"]))[0]
    other.put_manifest(fallback_tag(other_digest), index, "application/vnd.oci.image.index.v1+json")
    refused([*pull, f"{host}/kernels:sm90"], "does not match what was signed", dst)

    # Bytes changed in the registry's own storage: the layer, then the manifest.
    data = stored_blob(base, pushed["layer"]["digest"])
    original = data.read_bytes()
    data.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    try:
        refused([*pull, f"{host}/kernels:v1"], "does not match its digest", dst)
    finally:
        data.write_bytes(original)
    manifest = stored_blob(base, pushed["digest"])
    original = manifest.read_bytes()
    manifest.write_bytes(original.replace(b'"sm_100,sm_90"', b'"sm_100,sm_80"'))
    try:
        refused([*pull, f"{host}/kernels:v1"], "image manifest does not match its digest", dst)
    finally:
        manifest.write_bytes(original)


def stored_blob(root: Path, digest: str) -> Path:
    """Where the distribution registry's filesystem driver keeps a blob (manifests are blobs too)."""
    hex_digest = digest.split(":")[1]
    path = root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hex_digest[:2] / hex_digest / "data"
    assert path.is_file(), path
    return path


def copy_image(src: Registry, dst: Registry, digest: str) -> None:
    """Copy an image between repositories with our own client (blobs, then the manifest as :v1)."""
    import io
    data, media_type, _ = src.get_manifest(digest)
    manifest = json.loads(data)
    for desc in [manifest["config"], *manifest["layers"]]:
        out = io.BytesIO()
        src.fetch_blob(desc["digest"], desc["size"], out, "blob")
        dst.put_blob(desc["digest"], desc["size"], out.getvalue())
    dst.put_manifest("v1", data, media_type)


def registry_source(tmp_path: Path) -> Path:
    path = tmp_path / "small"
    with Store(path) as store:
        store.put_compile("x", cubin(99), symbol="x", meta={"kernel": "x", "arch": "sm_90"})
    return path


def test_bad_input_is_one_line_exit_2_and_writes_nothing(registry, pushed, source, tmp_path):
    host, _ = registry
    dst = tmp_path / "dst"
    refused(["pull", f"localhost:{free_port()}/kernels:v1", "--cache", str(dst), "--arch", "sm_90"],
            "cannot reach registry", dst)
    refused(["pull", f"{host}/kernels:v1", "--cache", str(dst), "--arch", "sm_80"], "not for sm_80", dst)
    refused(["pull", f"{host}/kernels:{fallback_tag(pushed['digest'])}", "--cache", str(dst), "--arch", "sm_90"],
            "is an image index", dst)
    refused(["pull", f"{host}/kernels:nope", "--cache", str(dst), "--arch", "sm_90"], "not found", dst)
    refused(["pull", f"{host}/kernels:v1", "--cache", str(dst)], "pass --arch", dst)

    # An image whose layer is not tar+gzip, and one whose layer is larger than the free space.
    layout = tmp_path / "layout"
    assert cli("push", "--cache", str(source), "--layout", str(layout), "v1")[0] == 0
    target = Layout(layout)
    data, media_type, _ = target.get_manifest("v1")
    manifest = json.loads(data)
    wrong = {**manifest, "layers": [{**manifest["layers"][0], "mediaType": "application/vnd.example.model"}]}
    target.put_manifest("wrong", json.dumps(wrong).encode(), media_type)
    refused(["pull", "wrong", "--layout", str(layout), "--cache", str(dst), "--arch", "sm_90"],
            "layer of media type 'application/vnd.example.model'", dst)
    huge = {**manifest, "layers": [{**manifest["layers"][0], "size": 2**50}]}
    target.put_manifest("huge", json.dumps(huge).encode(), media_type)
    refused(["pull", "huge", "--layout", str(layout), "--cache", str(dst), "--arch", "sm_90"],
            "free space or pull into a bigger volume", dst)
    code, _, err = cli("pull", "v1", "--layout", str(layout), "--cache", str(dst), "--arch", "sm_100")
    assert code == 0 and contents(dst) == contents(source), err


@pytest.fixture
def token_server():
    """A token endpoint: answers {"token": ...}, or 401 once ``refuse`` is set."""
    state = {"refuse": False, "asked": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            state["asked"] += 1
            body = json.dumps({"token": "t0k3n"}).encode()
            self.send_response(401 if state["refuse"] else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token", state
    server.shutdown()


@needs_registry
def test_bearer_token_challenge_and_a_401(token_server, source, tmp_path):
    """A registry answering 401 with a Bearer challenge (the distribution registry's `silly` auth):
    the client fetches a token and retries; a token endpoint that refuses gives one line, exit 2."""
    realm, state = token_server
    proc, host = start_registry(tmp_path / "authreg",
                                f"auth:\n  silly:\n    realm: {realm}\n    service: test-registry\n")
    try:
        code, _, err = cli("push", "--cache", str(source), f"{host}/kernels:v1")
        assert code == 0 and state["asked"] >= 1, err
        dst = tmp_path / "dst"
        assert cli("pull", f"{host}/kernels:v1", "--cache", str(dst), "--arch", "sm_90")[0] == 0
        state["refuse"] = True
        refused(["pull", f"{host}/kernels:v1", "--cache", str(tmp_path / "dst2"), "--arch", "sm_90"],
                "cannot get a token", tmp_path / "dst2")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unpacked_signed_layer_imports_as_a_directory(source, keys, tmp_path):
    """An image volume (or GKM) gives the pod the layer unpacked: `import DIR` verifies its signature."""
    import tarfile
    layout = tmp_path / "layout"
    assert cli("push", "--cache", str(source), "--layout", str(layout), "--sign", str(keys["private"]), "v1")[0] == 0
    manifest = json.loads(Layout(layout).get_manifest("v1")[0])
    if shutil.which("skopeo"):  # an independent reader of the layout
        inspect = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{layout}:v1"], capture_output=True,
                                            text=True, check=True).stdout)
        assert inspect["Layers"] == [manifest["layers"][0]["digest"]]
        assert inspect["Labels"] == manifest["annotations"]
    tree = tmp_path / "tree"
    with tarfile.open(layout / "blobs" / "sha256" / manifest["layers"][0]["digest"][7:]) as tar:
        tar.extractall(tree, filter="data")
    code, out, err = cli("import", str(tree), "--cache", str(tmp_path / "dst"), "--require-signature",
                         str(keys["public"]))
    assert code == 0 and "signature verified" in out, err
    assert contents(tmp_path / "dst") == contents(source)
    code, _, err = cli("import", str(tree), "--cache", str(tmp_path / "dst2"), "--require-signature",
                       str(keys["other"]))
    assert code == 2 and "wrong key" in err
    (tree / "blobs" / "extra").write_bytes(b"x")
    code, _, err = cli("import", str(tree), "--cache", str(tmp_path / "dst3"))
    assert code == 2 and "not a bundle blob" in err and len(err.strip().splitlines()) == 1


def test_bundle_signatures_ed25519_sequence_and_expiry(source, keys, tmp_path):
    """One verification path for bundles too: Ed25519 or an HMAC secret, freshness checks."""
    signed = tmp_path / "signed.tgz"
    assert cli("export", "--cache", str(source), "--sign", str(keys["private"]), "--sequence", "5",
               str(signed))[0] == 0
    ok = cli("import", "--cache", str(tmp_path / "a"), "--require-signature", str(keys["public"]),
             "--min-sequence", "5", str(signed))
    assert ok[0] == 0 and "signature verified" in ok[1], ok[2]
    code, _, err = cli("import", "--cache", str(tmp_path / "b"), "--require-signature", str(keys["public"]),
                       "--min-sequence", "6", str(signed))
    assert code == 2 and "below --min-sequence 6" in err
    code, _, err = cli("import", "--cache", str(tmp_path / "c"), "--require-signature", str(keys["other"]),
                       str(signed))
    assert code == 2 and "wrong key" in err

    from ctbuild.cache.signing import load_key
    secret = tmp_path / "shared.key"
    secret.write_bytes(os.urandom(32).hex().encode())
    expired = tmp_path / "expired.tar"
    with Store(source, readonly=True) as store:
        store.export_bundle(expired, sign_key=load_key(secret), expires=time.time() - 60)
    code, _, err = cli("import", "--cache", str(tmp_path / "d"), "--require-signature", str(secret), str(expired))
    assert code == 2 and "expired" in err
    code, _, err = cli("push", "--cache", str(source), "--layout", str(tmp_path / "l"), "--sign", str(secret), "v1")
    assert code == 2 and "HMAC secret" in err


def test_the_ctbuild_command_checks_the_gpu_arch_and_says_so_in_one_line(tmp_path):
    """Through `ctbuild` itself (it asks the CUDA driver for the GPU): with none visible, pull needs --arch."""
    from conftest import run_cli
    dst = tmp_path / "dst"
    proc = run_cli("cache", "pull", f"localhost:{free_port()}/kernels:v1", "--cache", str(dst))
    if "cannot reach registry" in proc.stderr:
        pytest.skip("a GPU is visible here: pull took its arch and went on to the registry")
    assert proc.returncode == 2 and "pass --arch" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("cache", "pull", f"localhost:{free_port()}/kernels:v1", "--cache", str(dst), "--arch", "sm_90")
    assert proc.returncode == 2 and "cannot reach registry" in proc.stderr, proc.stderr
    assert not dst.exists()


@needs_registry
def test_basic_auth_from_the_environment_or_docker_login_and_a_401(source, tmp_path, monkeypatch):
    """A registry with htpasswd (basic) auth: no credentials is a 401 in one line; the
    CTBUILD_REGISTRY_* variables or a `docker login` entry get in."""
    import base64
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        crypt = pytest.importorskip("crypt")  # bcrypt hashes for htpasswd; gone from Python 3.13
    (tmp_path / "htpasswd").write_text("ci:" + crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))
    proc, host = start_registry(tmp_path / "basicreg",
                                f"auth:\n  htpasswd:\n    realm: test\n    path: {tmp_path / 'htpasswd'}\n")
    for var in ("CTBUILD_REGISTRY_USER", "CTBUILD_REGISTRY_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    try:
        refused(["push", "--cache", str(source), f"{host}/kernels:v1"], "HTTP 401", tmp_path / "none")
        monkeypatch.setenv("CTBUILD_REGISTRY_USER", "ci")
        monkeypatch.setenv("CTBUILD_REGISTRY_PASSWORD", "wrong")
        refused(["push", "--cache", str(source), f"{host}/kernels:v1"], "not authorized", tmp_path / "none")
        monkeypatch.setenv("CTBUILD_REGISTRY_PASSWORD", "s3cret")
        assert cli("push", "--cache", str(source), f"{host}/kernels:v1")[0] == 0
        monkeypatch.delenv("CTBUILD_REGISTRY_USER")
        (tmp_path / "docker").mkdir()
        auth = base64.b64encode(b"ci:s3cret").decode()
        (tmp_path / "docker" / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        code, _, err = cli("pull", f"{host}/kernels:v1", "--cache", str(tmp_path / "dst"), "--arch", "sm_90")
        assert code == 0, err
    finally:
        proc.terminate()
        proc.wait(timeout=10)
