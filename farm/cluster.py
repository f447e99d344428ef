"""Starting an embedded Ray, or joining an existing cluster, for the farm.

Embedded (default): a local Ray sized to the worker count, started for speed: no dashboard,
no usage stats, worker logs not streamed to the driver (errors come back in job records).
Joining (``address`` or ``$RAY_ADDRESS``): the job's runtime_env ships the given Python
packages/modules to every node (``py_modules``), so kernel sources need not be installed there;
the workers must still have the toolchain, ray and xxhash installed. They need no cache path
and no shared filesystem: the driver alone writes the cache.

Signals stay the caller's: Ray's C++ core would print a native stack dump on SIGTERM
(`RAY_DISABLE_FAILURE_SIGNAL_HANDLER` defaults to 1 here, in the driver and the processes it
starts; set it to 0 to get the dumps back), and the SIGTERM/SIGINT handlers ``ray.init``
replaces on the main thread are put back, so the caller decides what a signal does.

An embedded Ray is watched by `ctbuild.farm.reaper`, so that a driver killed by SIGKILL leaves none of
the processes it started behind. Its daemons that do nothing for a build (`IDLE_DAEMONS`) run
only on CPU the compiles leave idle (`yield_idle_daemons`).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .reaper import process_table
from .records import FarmError

#: Files never shipped to cluster workers.
SHIP_EXCLUDES = ["__pycache__", "*.pyc", ".git", "*.egg-info"]

#: The embedded Ray's daemons (the driver's children) that a build needs nothing from: the log
#: monitor (worker logs are not streamed to the driver), the autoscaler's monitor (a local
#: cluster never scales) and the API server (no dashboard, no job submission). Not the GCS, the
#: raylet or its agents, which starting and scheduling the workers waits on.
IDLE_DAEMONS = ("ray/_private/log_monitor.py", "ray/autoscaler/_private/monitor.py",
                "ray/dashboard/dashboard.py")


def ray_installed() -> bool:
    """Whether Ray can be imported here (a serving install has no ``farm`` extra), without
    importing it (a second or so)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def resolve_address(address: str | None) -> str | None:
    """The cluster to join: the flag, else ``$RAY_ADDRESS``, else None (embedded)."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    return None if address in (None, "", "local") else address


def module_paths(modules: list[str], search: list[str]) -> list[str]:
    """The top-level package directories (or single .py files) that hold ``modules``, found
    under the ``search`` directories; what py_modules must ship for them to import."""
    found: list[str] = []
    for name in modules:
        top = name.split(".")[0]
        for base in search:
            pkg, mod = Path(base) / top, Path(base) / f"{top}.py"
            hit = str(pkg) if (pkg / "__init__.py").is_file() else str(mod) if mod.is_file() \
                else None
            if hit:
                if hit not in found:
                    found.append(hit)
                break
        else:
            raise FarmError(f"cannot ship module {name!r} to the cluster: no package "
                            f"{top}/ or {top}.py under {', '.join(search) or '(no paths)'}")
    return found


def start_reaper() -> int:
    """Start `ctbuild.farm.reaper` watching this process; returns the pipe end to say goodbye on."""
    read, write = os.pipe()
    subprocess.Popen([sys.executable, str(Path(__file__).with_name("reaper.py")),
                      str(os.getpid()), str(read)], pass_fds=(read,), start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    os.close(read)
    return write


def stop_reaper(pipe: int) -> None:
    """A normal shutdown: tell the reaper to exit without killing anything."""
    try:
        os.write(pipe, b"bye")
    finally:
        os.close(pipe)


def connect(address: str | None, num_cpus: int, ship: list[str] | None = None,
            env_vars: dict[str, str] | None = None) -> dict[str, Any]:
    """Start (address None) or join Ray. Returns {"owned", "address", "cpus", "reaper"}."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    import ray
    if ray.is_initialized():
        return {"owned": False, "address": address, "cpus": _cpus(ray), "reaper": None}
    common = dict(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True,
                  namespace="ctbuild-farm")
    if address is not None:
        _check_reachable(address)
    reaper = start_reaper() if address is None else None
    # Started from a background thread, Ray notes that it cannot install its SIGTERM handler;
    # the farm stops Ray itself (and the reaper covers a killed driver): noise in a build log.
    logging.getLogger("ray._private.worker").addFilter(
        lambda r: "SIGTERM handler is not set" not in r.getMessage())
    try:
        with _callers_signals():
            if address is None:
                # Ray warns that its new local cluster uses token auth; for an embedded, private
                # cluster that is noise in a build log.
                logging.getLogger("ray._private.authentication.authentication_token_setup"
                                  ).setLevel(logging.ERROR)
                ray.init(address="local", num_cpus=num_cpus, num_gpus=0, include_dashboard=False,
                         object_store_memory=128 * 1024 * 1024, **common)
                yield_idle_daemons(os.getpid())
            else:
                runtime_env: dict[str, Any] = {"env_vars": {"RAY_USAGE_STATS_ENABLED": "0",
                                                            **(env_vars or {})}}
                if ship:
                    runtime_env["py_modules"] = list(ship)
                    runtime_env["excludes"] = SHIP_EXCLUDES
                ray.init(address=address, runtime_env=runtime_env, **common)
    except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; all mean "no cluster"
        where = f"join the Ray cluster at {address}" if address else "start a local Ray"
        why = f"{type(exc).__name__}: {exc}"
        cause = exc.__cause__
        if cause is not None and "Auth" in type(cause).__name__:
            why += (" (the cluster uses token authentication: set RAY_AUTH_MODE=token and "
                    "provide its token in ~/.ray/auth_token or $RAY_AUTH_TOKEN)")
        elif cause is not None:
            why += f" ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})"
        if reaper is not None:
            stop_reaper(reaper)
        raise FarmError(f"could not {where}: {why}") from exc
    return {"owned": True, "address": address, "cpus": _cpus(ray), "reaper": reaper}


@contextmanager
def _callers_signals() -> Iterator[None]:
    """Put back the SIGTERM/SIGINT handlers ``ray.init`` replaces on the main thread (its
    SIGTERM handler exits without a word); elsewhere Ray sets none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def yield_idle_daemons(driver: int) -> list[int]:
    """Put the `IDLE_DAEMONS` among ``driver``'s children under ``SCHED_IDLE``; their PIDs.

    Ray runs its workers niced (15) and its daemons not, so on a small machine the daemons'
    start-up (seconds of Python imports each) and polling came before the compiles: on 2 cores
    they took 4% of the CPU while jobs compiled. ``SCHED_IDLE`` runs them on what the
    compiles leave; Linux only, and where it is refused they keep their priority."""
    found = []
    for pid, cmdline in child_processes(driver):
        if any(d in cmdline for d in IDLE_DAEMONS):
            try:
                os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
                found.append(pid)
            except (AttributeError, OSError):
                pass
    return found


def child_processes(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of ``parent``'s child processes, from ``/proc`` (none elsewhere)."""
    try:
        table = process_table()
    except OSError:
        return []
    out = []
    for pid, (ppid, _) in table.items():
        if ppid != parent:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        out.append((pid, cmdline.decode(errors="replace")))
    return out


#: Seconds `_check_reachable` waits for a TCP connection to ``--address`` before the build fails.
REACHABLE_TIMEOUT_S = 10.0


def _check_reachable(address: str, timeout: float = REACHABLE_TIMEOUT_S) -> None:
    """Fail fast when nothing listens at a host:port address (Ray itself retries for minutes)."""
    if "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise FarmError(f"--address {address!r}: expected HOST:PORT, e.g. 10.0.0.5:6379")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise FarmError(f"could not join the Ray cluster at {address}: nothing answers there "
                        f"({exc}); start it with 'ray start --head --port {port}' or fix "
                        "--address / $RAY_ADDRESS") from None


def _cpus(ray: Any) -> int:
    return int(ray.cluster_resources().get("CPU", 0))


def disconnect(owned: bool, reaper: int | None = None) -> None:
    if owned:
        import ray
        if ray.is_initialized():
            ray.shutdown()
    if reaper is not None:
        stop_reaper(reaper)
