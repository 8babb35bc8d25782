"""Another user (or another process of ours) on the same host: the processes we start accept
only us, the trace cache trusts nothing it did not write, every name printed is escaped
(issue 41)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from residency.analysis import idle
from residency.analysis.idle import idle_summary_at
from tests.test_tracecache import MARKER, many_ranks, run_cli

ROOT = Path(__file__).resolve().parent.parent


# -- F1, F10-F12: the Dask cluster -----------------------------------------------------------

@pytest.mark.slow
def test_the_local_cluster_refuses_a_second_client(tmp_path, monkeypatch):
    """While `--scheduler local` runs, a second plain client (the same user, the address read
    off the listening sockets) and a client with TLS credentials of its own are refused: only
    this process holds the cluster's credentials (F1)."""
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not "
                                      "installed (pip install 'residency[cluster]')")
    from distributed.security import Security

    tried = {}
    real_map = distributed.Client.map

    def strangers(self, *args, **kwargs):
        address = self.scheduler.address
        host_port = address.split("://", 1)[1]
        for name, addr, security in (
                ("plain", f"tcp://{host_port}", None),
                ("own-tls", f"tls://{host_port}", Security.temporary())):
            try:
                with distributed.Client(addr, security=security, timeout="5s") as c:
                    c.run_on_scheduler(lambda: 1)
                tried[name] = "connected"
            except Exception as exc:  # noqa: BLE001 - any refusal will do
                tried[name] = type(exc).__name__
        return real_map(self, *args, **kwargs)

    monkeypatch.setattr(distributed.Client, "map", strangers)
    d = many_ranks(tmp_path / "t", 2)
    local = idle_summary_at(d, marker=MARKER, cache=False)
    assert idle_summary_at(d, marker=MARKER, cache=False, scheduler="local",
                           workers=1) == local
    assert set(tried) == {"plain", "own-tls"}
    assert "connected" not in tried.values(), tried


@pytest.mark.parametrize(("address", "words"), [
    ("tls://127.0.0.1:1", "needs TLS credentials"),
    ("ucx://127.0.0.1:1", "cannot be used here"),
    ("foo://127.0.0.1:1", "unknown address scheme 'foo'"),
])
@pytest.mark.parametrize("via", ["option", "environment"])
def test_a_scheduler_address_of_any_scheme_is_one_line_exit_2(address, words, via, tmp_path,
                                                              monkeypatch):
    """tls:// and ucx:// (F10), unknown schemes: one line naming the address, exit 2."""
    pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    d = many_ranks(tmp_path / "t", 2)
    if via == "option":
        rc, out, err = run_cli("idle", str(d), "--no-cache", "--scheduler", address)
    else:
        monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", address)
        rc, out, err = run_cli("idle", str(d), "--no-cache")
    assert rc == 2 and not out, err
    assert err.count("\n") == 1 and address in err and words in err, err


def test_a_scheduler_that_accepts_and_says_nothing_is_a_bounded_wait(tmp_path, monkeypatch):
    """A listener that accepts and never answers Dask's handshake: a clear line after the
    connect timeout, not a silent wait (F11)."""
    pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setattr(idle, "SCHEDULER_CONNECT_S", 1.0)
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    try:
        rc, out, err = run_cli("idle", str(many_ranks(tmp_path / "t", 2)), "--no-cache",
                               "--scheduler", address)
    finally:
        listener.close()
        for c in held:
            c.close()
    assert rc == 2 and not out, err
    assert err.count("\n") == 1 and "did not complete Dask's handshake within 1 s" in err, err


@pytest.mark.slow
def test_a_refused_trace_on_the_local_cluster_prints_one_line(tmp_path):
    """Dask's log noise (a task's "Compute Failed" block, the HTTP port moved, late socket
    warnings) never reaches the user: the refusal is the only line on stderr (F12)."""
    pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    d = many_ranks(tmp_path / "t", 4)
    (d / "rank2" / "trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1,]}')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-m", "residency", "idle", str(d), "--no-cache",
                           "--scheduler", "local", "--workers", "2"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("residency idle: error: ") and "rank2" in proc.stderr
