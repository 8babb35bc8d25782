"""The workload service: `ranks` processes with torch.distributed behind an HTTP front end.

The front process serves HTTP on loopback and watches the ranks; rank 0 takes each request
from it and broadcasts it; every rank runs the pipeline on its own device; rank 0 gathers the
per-rank summaries and hands them back.

This module runs the service process from start to exit code: its decisions folder, the
rendezvous, signals and the starting process's death. The pieces: `config` (`ServeConfig`),
`ranks` (the rank processes), `front` (`Service`), `http` (reading requests),
`admission` (connection caps, request bounds).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from residency.processes import die_with_parent, parent_gone, remove_scratch, watched_parent
from residency.records.decisions import decisions_file
from residency.workload.admission import BoundedHTTPServer
from residency.workload.config import ServeConfig
from residency.workload.front import Service
from residency.workload.http import request_handler

ORPHAN_GRACE_S = 3.0            # rank stop grace once the starting process is gone


def prepare_decisions_dir(path: str | os.PathLike[str], ranks: int) -> None:
    """Make `path` (new, or a folder without decisions) ready for a service: never a link,
    never appended to; each `decisions-rank<r>.jsonl` created here, exclusively and without
    following a link (O_EXCL | O_NOFOLLOW).

    Raises:
        ValueError: `path` is a link, not a folder, or already holds decisions (named).
    """
    d = Path(path)
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        d.mkdir(parents=True)
    else:
        if stat.S_ISLNK(st.st_mode):
            raise ValueError(f"--decisions-dir {d}: is a symbolic link; give a real folder")
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"--decisions-dir {d}: exists and is not a folder")
        stale = sorted(p.name for p in d.iterdir() if p.name.startswith("decisions-rank"))
        if stale:
            raise ValueError(f"--decisions-dir {d}: already holds {stale[0]}"
                             f"{f' and {len(stale) - 1} more' if len(stale) > 1 else ''}; "
                             "decisions are never appended to: use a new or empty folder")
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    for rank in range(ranks):
        target = d / decisions_file(rank)
        try:
            os.close(os.open(target, flags, 0o644))
        except FileExistsError:
            raise ValueError(f"--decisions-dir {d}: {target.name} appeared while the "
                             "service started; use a new or empty folder") from None


def serve(cfg: ServeConfig, *, port: int = 0, failure_grace_s: float = 3.0) -> int:
    """Run the service until SIGTERM/SIGINT (exit 0), a rank failure (exit 3) or the exit of
    the process named by `RESIDENCY_PARENT_PID` (exit 3, the running request cancelled)."""
    prepare_decisions_dir(cfg.decisions_dir, cfg.ranks)
    if cfg.profile_dir:
        Path(cfg.profile_dir).mkdir(parents=True, exist_ok=True)
    rendezvous_dir = None
    if not cfg.rendezvous:  # a file store: no TCP listener for the rendezvous at all
        rendezvous_dir = tempfile.mkdtemp(prefix="residency-rdzv-")
        cfg = ServeConfig(**{**asdict(cfg), "rendezvous": f"file://{rendezvous_dir}/store"})
    try:
        return _serve(cfg, port=port, failure_grace_s=failure_grace_s)
    finally:
        if rendezvous_dir is not None:
            shutil.rmtree(rendezvous_dir, ignore_errors=True)


def _serve(cfg: ServeConfig, *, port: int, failure_grace_s: float) -> int:
    parent = watched_parent()
    if parent is not None:
        die_with_parent(signal.SIGTERM)
        if parent_gone(parent):
            print("error: the starting process is already gone", file=sys.stderr)
            return 3
    service = Service(cfg)
    try:
        httpd = BoundedHTTPServer(("127.0.0.1", port), request_handler(service))
    except OSError as exc:
        print(f"residency serve: error: cannot listen on 127.0.0.1:{port}: {exc.strerror}",
              file=sys.stderr)
        return 2
    stop_event = threading.Event()
    exit_code = [0]

    def orphaned() -> bool:
        return parent is not None and parent_gone(parent)

    def on_signal(signum: int, frame: Any) -> None:
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    service.start()
    try:
        service.wait_ready(abort=lambda: stop_event.is_set() or orphaned())
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        service.stop(grace_s=2.0)
        httpd.shutdown()
        return 3
    if stop_event.is_set() or orphaned():  # a signal during warm-up
        gone = orphaned()
        service.stop(grace_s=ORPHAN_GRACE_S if gone else 20.0)
        httpd.shutdown()
        if gone:
            remove_scratch()
        return 3 if gone else 0
    port = httpd.server_address[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    while not stop_event.wait(0.2):
        if orphaned():
            break
        if service.check_ranks():
            print(f"error: {service.failure}; stopping", file=sys.stderr, flush=True)
            exit_code[0] = 3
            time.sleep(failure_grace_s)  # /health answers 503 naming the rank meanwhile
            break
    if orphaned():
        # the process that started us is gone (killed): nobody waits for the answer
        print("error: the starting process is gone; stopping", file=sys.stderr, flush=True)
        service.cancel_current("starting process gone")
        service.stop(grace_s=ORPHAN_GRACE_S)
        httpd.shutdown()
        httpd.server_close()
        remove_scratch()  # its TMPDIR and raw profiles: the starting process cannot any more
        return 3
    # finish the current request (or give up after the grace), then stop the ranks
    if service.busy.acquire(timeout=60.0):
        service.busy.release()
    service.stop()
    httpd.shutdown()
    httpd.server_close()
    if orphaned():  # the SIGTERM was the parent's death signal: its threads die one by one,
        remove_scratch()  # so only now is it surely gone (a normal stop waits for us)
    print("stopped", flush=True)
    return exit_code[0]
