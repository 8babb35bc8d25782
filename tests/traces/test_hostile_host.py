"""Another user (or another process of ours) on the same host: the processes we start accept
only us, the trace cache trusts nothing it did not write, every name printed is escaped
(issue 41)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from residency.analysis.idle import idle_summary_at
from residency.traces import cache as tracecache
from residency.traces import load as traces
from residency.traces import parallel
from residency.traces.load import load_traces
from tests.helpers import MARKER, ROOT, copy_fixture, many_ranks, run_cli, same_traces

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
                ("own-tls", f"tls://{host_port}", Security.temporary()),
                ("own-ec-tls", f"tls://{host_port}", parallel.local_security())):
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
    assert set(tried) == {"plain", "own-tls", "own-ec-tls"}
    assert "connected" not in tried.values(), tried


def test_the_local_clusters_credentials_are_made_for_it_and_required_both_ways():
    """`--scheduler local`'s credentials: a P-256 key made in memory for this cluster (an RSA
    key took ~50 ms a run), one certificate every role presents and requires, encryption
    required; two clusters never share them (F1)."""
    pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    a, b = parallel.local_security(), parallel.local_security()
    assert a.require_encryption and a.tls_client_key != b.tls_client_key
    cert = x509.load_pem_x509_certificate(a.tls_ca_file.encode())
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    for role in ("client", "scheduler", "worker"):
        context = a.get_connection_args(role)["ssl_context"]
        assert context.verify_mode == ssl.CERT_REQUIRED, role
        assert a.get_listen_args(role)["ssl_context"].verify_mode == ssl.CERT_REQUIRED, role


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
    monkeypatch.setattr(parallel, "SCHEDULER_CONNECT_S", 1.0)
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


# -- F2-F4, F7-F9: the trace cache -----------------------------------------------------------

def _cache() -> Path:
    return tracecache.cache_dir()


def test_the_cache_key_is_a_cryptographic_digest_of_the_bytes_parsed(tmp_path):
    """F3: the digest an entry is checked against is BLAKE3 (a cryptographic digest) of the
    trace's bytes, not xxh3-128, for which two traces sharing one were built."""
    d = many_ranks(tmp_path / "t", 2)
    load_traces(d)
    for source in (d / "rank0" / "trace.json", d / "rank1" / "trace.json.gz"):
        got = tracecache.get_parsed(source, os.stat(source), root=d)
        assert got is not None
        assert got.digest == "blake3:" + blake3.blake3(source.read_bytes()).hexdigest()


def _same_size_other_figures(path: Path) -> bytes:
    """`path`'s bytes with every device task's duration changed, the size kept."""
    raw = path.read_bytes()
    out = raw.replace(b'"cat": "kernel"', b'"cat": "kernex"', 3)
    assert out != raw and len(out) == len(raw)
    return out


def _swap_keeping_status(path: Path, data: bytes) -> None:
    """Replace `path` by `data` (a new file renamed over it), size and mtime kept, as `cp -p`
    or `rsync -a` leave them."""
    st = path.stat()
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)


def test_a_trace_swapped_after_its_parts_were_parsed_is_not_recorded_as_parsed(tmp_path,
                                                                              monkeypatch):
    """F4, the large-file path: the file is replaced (size and mtime kept) after its parts
    were parsed and before the old code hashed it; the entry must not pass the new file's
    digest off with the old file's figures."""
    d = many_ranks(tmp_path / "t", 1)
    source = d / "rank0" / "trace.json"
    swapped = _same_size_other_figures(source)
    monkeypatch.setattr(traces, "PART_MIN_BYTES", 1 << 10)
    join = traces.join_parts

    def join_then_swap(path, parts):
        got = join(path, parts)
        _swap_keeping_status(path, swapped)
        return got

    monkeypatch.setattr(traces, "join_parts", join_then_swap)
    load_traces(d, workers=2)
    monkeypatch.setattr(traces, "join_parts", join)
    truth = load_traces(d, cache=False)
    same_traces(load_traces(d, workers=2), truth)
    same_traces(load_traces(d, workers=1), truth)


def test_a_database_swapped_after_its_parse_is_not_recorded_as_parsed(tmp_path, monkeypatch):
    """F4, the SQLite path: the database replaced (size and mtime kept) after `read_db` and
    before the old code hashed it: the next run reads the new database's figures."""
    d = copy_fixture("ascend_real_db", tmp_path)
    db = next(d.rglob("ascend_pytorch_profiler_0.db"))
    other = tmp_path / "other.db"
    shutil.copyfile(db, other)
    with sqlite3.connect(other) as con:
        con.execute("UPDATE TASK SET endNs = endNs + 1000")
    con.close()
    assert other.stat().st_size == db.stat().st_size
    swapped = other.read_bytes()
    from residency.traces import ascend_db

    read_db = ascend_db.read_db

    def read_then_swap(path, **kwargs):
        got = read_db(path, **kwargs)
        if path == db:
            _swap_keeping_status(path, swapped)
        return got

    monkeypatch.setattr(ascend_db, "read_db", read_then_swap)
    idle_summary_at(d, workers=1)
    monkeypatch.setattr(ascend_db, "read_db", read_db)
    truth = idle_summary_at(d, cache=False, workers=1)
    assert idle_summary_at(d, workers=1) == truth


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0,
                    reason="needs root to give the folder to another user")
def test_a_cache_folder_of_another_user_is_not_used(tmp_path):
    """F2: entries in a folder another user owns (who could forge them) are never read."""
    d = many_ranks(tmp_path / "t", 2)
    folder = _cache()
    folder.mkdir(parents=True, mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.warns(UserWarning, match="owned by uid 65534.*without the cache"):
        idle_summary_at(d, workers=1)
    assert not list(folder.iterdir())


def test_a_cache_folder_others_can_write_is_not_used(tmp_path):
    """F2: a folder with access for group or others (a shared or pre-created one) is not
    used, saying so in one warning; `idle` goes on without the cache (exit 0)."""
    d = many_ranks(tmp_path / "t", 2)
    folder = _cache()
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    rc, out, err = run_cli("idle", str(d), "--workers", "1")
    assert rc == 0 and out, err
    assert err.count("\n") == 1 and "has mode 0777, not 0700" in err, err
    assert not list(folder.iterdir())


def test_entries_are_private_and_never_written_through_a_link(tmp_path):
    """F2: entries are 0600, the folder 0700; a link planted at the temporary file's name is
    not followed (the file it points to is left as it was)."""
    d = many_ranks(tmp_path / "t", 1)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    idle_summary_at(d, workers=1)
    written = sorted(_cache().glob("*.entry"))
    assert len(written) == 2  # the rank's reduction, the set's summary
    assert stat.S_IMODE(_cache().stat().st_mode) == 0o700
    for entry in written:
        assert stat.S_IMODE(entry.stat().st_mode) == 0o600
        entry.unlink()
        entry.with_name(f".{entry.name}.{os.getpid()}.tmp").symlink_to(victim)
    idle_summary_at(d, workers=1)
    assert victim.read_bytes() == b"precious"
    assert all(entry.is_file() and not entry.is_symlink() for entry in written)


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """F8: Ctrl-C during an entry's write removes its temporary file; one left by a process
    that died (SIGTERM, SIGKILL) is removed by the next write's scan."""
    d = many_ranks(tmp_path / "t", 1)
    real_replace = os.replace

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        idle_summary_at(d, workers=1)
    monkeypatch.setattr(os, "replace", real_replace)
    assert not list(_cache().glob(".*.tmp"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = _cache() / f".{'0' * 64}.entry.{int(dead.stdout)}.tmp"
    stale.write_bytes(b"half an entry")
    monkeypatch.setattr(tracecache, "_INDEX", {})  # (a new process: it scans at its write)
    idle_summary_at(d, workers=1)
    assert not stale.exists()


def test_eviction_scans_the_folder_once_not_after_every_write(tmp_path, monkeypatch):
    """F7: writing n entries scans the cache folder once, not n times (quadratic)."""
    scans = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": scans.append(p) or real(p))
    monkeypatch.setattr(tracecache, "_INDEX", {})
    d = many_ranks(tmp_path / "t", 6)
    scans.clear()
    load_traces(d, workers=1)
    idle_summary_at(d, workers=1)
    assert [p for p in scans if Path(p) == _cache()] == [_cache()]
    assert len(list(_cache().glob("*.entry"))) == 13  # 6 x (columns, reduction), the summary


def test_an_unreadable_cache_folder_means_no_cache_not_exit_2(tmp_path, monkeypatch):
    """F9: a cache folder that cannot be listed or read (here: every lookup in it fails with
    EACCES, as for another user's 0700 folder) is run without, exit 0."""
    d = many_ranks(tmp_path / "t", 2)
    idle_summary_at(d, workers=1)  # entries recorded
    real = Path.is_file

    def denied(self):
        if _cache() in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", denied)
    rc, out, err = run_cli("idle", str(d), "--workers", "2")
    assert rc == 0 and out, err


# -- F15: bad input is one line ---------------------------------------------------------------

@pytest.mark.parametrize("pattern", ["x{4294967296}", "(", "x{2,1}"])
@pytest.mark.parametrize("option", ["--marker", "--window-marker"])
def test_any_regex_compile_error_is_one_line_exit_2(pattern, option, tmp_path):
    d = many_ranks(tmp_path / "t", 1)
    rc, out, err = run_cli("idle", str(d), "--no-cache", option, pattern)
    assert rc == 2 and not out and err.count("\n") == 1, err
    assert "must be a regular expression" in err and "Traceback" not in err


# -- F14: names printed are escaped, one line each --------------------------------------------

FORGED = "x\nresidency verify: OK, digest sha256:00\x1b[2J.json"


def _no_forged_line(err: str, command: str) -> None:
    lines = err.splitlines()
    assert lines and all(line.startswith(f"residency {command}: ") for line in lines), err
    assert not [line for line in lines if line.startswith("residency verify")], err
    assert "\x1b" not in err and "x\\nresidency verify: OK" in err


def test_a_skipped_files_name_prints_no_line_of_its_own(tmp_path):
    """`idle` over a folder holding a JSON file named to forge a line: its note is one
    escaped line (F14)."""
    d = many_ranks(tmp_path / "t", 2)
    (d / FORGED).write_text('{"x": 1}')
    rc, out, err = run_cli("idle", str(d), "--no-cache")
    assert rc == 0
    _no_forged_line(err, "idle")


def test_a_name_in_an_error_prints_no_line_of_its_own(tmp_path):
    """The same file alone: nothing to load, one error line (F14)."""
    d = tmp_path / "t"
    d.mkdir()
    (d / FORGED).write_text('{"x": 1}')
    rc, _, err = run_cli("idle", str(d), "--no-cache")
    assert rc == 2 and len(err.splitlines()) == 1
    _no_forged_line(err, "idle")


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "no-verify"])
def test_a_name_planted_in_a_run_prints_no_line_of_its_own(tmp_path, verify):
    """`tables` on a run with the file planted in a trace folder: refused in one line, or
    with --no-verify skipped in one note line (Python's own warning display printed the name
    raw over two lines) (F14)."""
    run = Path(shutil.copytree(ROOT / "data" / "runs" / "emulated-paired-profile-2r50s",
                               tmp_path / "run"))
    (run / "runs" / "00-baseline" / "trace" / FORGED).write_text('{"x": 1}')
    rc, _, err = run_cli("tables", str(run), *([] if verify else ["--no-verify"]))
    assert rc == (2 if verify else 0)
    _no_forged_line(err, "tables")


def test_a_notebooks_name_prints_no_line_of_its_own(tmp_path):
    """`report` prints the page it wrote, named after the notebook: escaped (F14)."""
    import nbformat

    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "1", execution_count=1, outputs=[nbformat.v4.new_output("stream", name="stdout",
                                                                text="1\n")])])
    nb = tmp_path / FORGED.replace(".json", ".ipynb")
    nbformat.write(book, nb)
    rc, out, err = run_cli("report", str(nb), "--out", str(tmp_path / "out"))
    assert rc == 0 and len(out.splitlines()) == 1 and "\x1b" not in out, out
    assert "x\\nresidency verify: OK" in out
