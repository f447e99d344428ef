"""`cache pull` and `cache push` never hang and never give up on a good signature too early:
a real local HTTP server thread that sends a byte at a time (or nothing) meets --timeout and
--read-timeout, each ending in one line, exit 2, nothing written; and signature referrers are
read until one verifies, up to MAX_SIGNATURES, with a clear line at the bound."""
from __future__ import annotations

import contextlib
import io
import json
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.cache.__main__ import main as cache_main
from ctbuild.cache.oci.layout import Layout

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n"
        b"Content-Length: 4096\r\n\r\n")
DRIP_S = 0.2  # far below every --read-timeout here: only the overall deadline can end a drip


class SlowRegistry(socketserver.ThreadingTCPServer):
    """Answers every request slowly: ``mode`` "body" sends the headers, then the body a byte at a
    time; "head" sends even the status line a byte at a time; "stall" sends the headers, then
    nothing until the client hangs up."""
    daemon_threads = True
    allow_reuse_address = True
    mode = "body"


class SlowHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(65536)
        mode = self.server.mode  # type: ignore[attr-defined]
        response = HEAD + b" " * 4096
        sent = 0 if mode == "head" else len(HEAD)
        try:
            self.request.sendall(response[:sent])
            if mode == "stall":
                self.request.recv(1)  # returns when the client closes
                return
            for i in range(sent, len(response)):
                time.sleep(DRIP_S)
                self.request.sendall(response[i:i + 1])
        except OSError:  # the client gave up
            pass


@pytest.fixture
def slow_registry() -> Iterator[SlowRegistry]:
    server = SlowRegistry(("127.0.0.1", 0), SlowHandler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def cli(*args: str) -> tuple[int, str, str]:
    """`ctbuild cache ARGS` in this process (argparse's exit for a bad flag included)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cache_main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def refused_in_time(args: list[str], message: str, within_s: float) -> None:
    started = time.monotonic()
    code, _, err = cli(*args)
    took = time.monotonic() - started
    assert code == 2 and message in err, (code, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert took < within_s, f"took {took:.1f} s"


def small_cache(path: Path) -> Path:
    with Store(path) as store:
        store.put_compile("k", b"\x7fELF" * 64, symbol="s", meta={"kernel": "k", "arch": "sm_90"})
    return path


def test_a_registry_sending_a_byte_at_a_time_meets_the_deadline(slow_registry: SlowRegistry,
                                                                 tmp_path: Path) -> None:
    ref = f"127.0.0.1:{slow_registry.server_address[1]}/kernels:v1"
    dst = tmp_path / "dst"
    refused_in_time(["pull", ref, "--cache", str(dst), "--arch", "sm_90", "--timeout", "0.5",
                     "--read-timeout", "5"], "did not finish within --timeout 0.5 s", within_s=2.5)
    assert not dst.exists()
    slow_registry.mode = "head"
    refused_in_time(["push", ref, "--cache", str(small_cache(tmp_path / "src")), "--timeout", "0.5",
                     "--read-timeout", "5"], "did not finish within --timeout 0.5 s", within_s=2.5)


def test_a_registry_that_stops_sending_meets_the_read_timeout(slow_registry: SlowRegistry,
                                                               tmp_path: Path) -> None:
    slow_registry.mode = "stall"
    ref = f"127.0.0.1:{slow_registry.server_address[1]}/kernels:v1"
    dst = tmp_path / "dst"
    refused_in_time(["pull", ref, "--cache", str(dst), "--arch", "sm_90", "--read-timeout", "0.5"],
                    "sent nothing for 0.5 s", within_s=3)
    assert not dst.exists()
    code, _, err = cli("pull", ref, "--cache", str(dst), "--arch", "sm_90", "--timeout", "0")
    assert code == 2 and "invalid seconds '0'" in err


def test_signatures_are_tried_until_one_verifies_up_to_a_bound(tmp_path: Path) -> None:
    """Foreign signatures listed before the real one (old code read only the first 16)."""
    pytest.importorskip("cryptography")
    from ctbuild.cache.oci.referrers import MAX_SIGNATURES, attach_signature
    from ctbuild.cache.signing import keygen, load_key, sign
    for name in ("ci", "other"):
        keygen(tmp_path / f"{name}.pem", tmp_path / f"{name}.pub.pem")
    layout = tmp_path / "layout"
    assert cli("push", "--cache", str(small_cache(tmp_path / "src")), "--layout", str(layout),
               "--sign", str(tmp_path / "ci.pem"), "v1")[0] == 0
    target = Layout(layout)
    data, media_type, digest = target.get_manifest("v1")
    subject = {"mediaType": media_type, "digest": digest, "size": len(data)}
    other = load_key(tmp_path / "other.pem")

    def foreign_signatures_first(count: int) -> None:
        real = target.referrers(digest)
        for n in range(count):
            attach_signature(target, subject, sign(digest, other, sequence=n + len(real)))
        index = json.loads((layout / "index.json").read_text())
        index["manifests"].sort(key=lambda m: m in real)  # the real signature listed last
        (layout / "index.json").write_text(json.dumps(index))

    pull = ["pull", "v1", "--layout", str(layout), "--arch", "sm_90", "--require-signature",
            "--key", str(tmp_path / "ci.pub.pem")]
    foreign_signatures_first(20)
    code, out, err = cli(*pull, "--cache", str(tmp_path / "dst"))
    assert code == 0 and "signature verified" in out, err
    foreign_signatures_first(MAX_SIGNATURES - 20)
    dst = tmp_path / "dst2"
    refused_in_time([*pull, "--cache", str(dst)], f"none of the first {MAX_SIGNATURES} verifies", within_s=10)
    assert not dst.exists()
