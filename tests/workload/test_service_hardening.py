"""The service's HTTP front end and decisions folder against slow, smuggling and planting
clients (issue 28, 6): in process, on loopback, no ranks (a stand-in service object)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from residency.records.decisions import decisions_file
from residency.workload import http as service_http
from residency.workload.admission import (
    MAX_HANDLERS,
    MAX_PER_CLIENT,
    BoundedHTTPServer,
    client_key,
)
from residency.workload.service import prepare_decisions_dir
from tests.servicekit import wait_for


class _Stub:
    """What the handler asks of a service: /health and /v1/generate."""

    def __init__(self) -> None:
        self.generated: list[dict] = []

    def health(self) -> tuple[int, dict]:
        return 200, {"status": "ok"}

    def generate(self, body: dict, client_gone=None) -> tuple[int, dict]:
        self.generated.append(body)
        return 200, {"request_id": f"r{len(self.generated):04d}"}


@contextmanager
def _server(**kwargs) -> Iterator[tuple[tuple[str, int], _Stub]]:
    stub = _Stub()
    httpd = BoundedHTTPServer(("127.0.0.1", 0), service_http.request_handler(stub), **kwargs)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address, stub
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=60)


def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=60) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _health(address: tuple[str, int]) -> bytes:
    with socket.create_connection(address, timeout=60) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return s.recv(65536)


# ------------------------------------------------------------------ body framing: no smuggling
def test_transfer_encoding_is_refused_not_ignored() -> None:
    """Before: `Transfer-Encoding` was ignored, so a chunked body ran as a second request."""
    smuggled = b'POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{"steps": 1}\n'
    chunk = b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled)
    with _server() as (address, stub):
        reply = _exchange(address, b"POST /v1/generate HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n" + chunk)
    assert reply.startswith(b"HTTP/1.1 501"), reply
    assert b"Transfer-Encoding is not supported" in reply
    assert reply.count(b"HTTP/1.1 ") == 1 and stub.generated == []


def test_two_content_lengths_are_400() -> None:
    """Before: the first of two `Content-Length` headers was used and the rest of the body
    was read as the next request."""
    body = b'{"steps": 1}'
    second = b'POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{"steps": 2}\n'
    with _server() as (address, stub):
        reply = _exchange(address, b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\nContent-Length: "
                          + str(len(body) + len(second)).encode() + b"\r\n\r\n" + body + second)
    assert reply.startswith(b"HTTP/1.1 400") and b"more than one Content-Length" in reply
    assert reply.count(b"HTTP/1.1 ") == 1 and stub.generated == []


# ------------------------------------------------------------------ slow clients
def test_headers_have_one_deadline_for_the_whole_request(monkeypatch) -> None:
    """A client trickling a byte at a time (each read well inside the per-read timeout) is
    closed once the request's headers are not complete by the whole-header deadline (before:
    only each read was bounded, so it held its handler for as long as it trickled). The
    deadline is set to 1 s here; the test waits on the condition (a hang guard, no
    threshold)."""
    monkeypatch.setattr(service_http, "HEADER_TIMEOUT_S", 1.0)
    closed = threading.Event()
    with _server() as (address, _):
        s = socket.create_connection(address, timeout=60)
        s.settimeout(0.2)

        def trickling() -> bool:
            try:
                s.sendall(b"X")
                data = s.recv(1)
            except TimeoutError:
                return False  # still open: the server waits for more
            except OSError:
                data = b""
            if data == b"":
                closed.set()
            return closed.is_set()

        try:
            wait_for(trickling, what="the server closing a trickling connection",
                     hang_guard_s=120)
        finally:
            s.close()
    assert closed.is_set()


def test_health_answers_while_one_client_holds_its_whole_share() -> None:
    """16 connections of one client trickling: it gets `MAX_PER_CLIENT` handler slots, the
    rest are 503 at once, and another client's /health is answered (before: the 16 took every
    slot and /health was 503 for as long as they trickled). Clients are told apart by the
    key function; on Linux the real one is the connection's local user (the trickler here
    uses 127.0.0.2 and a key by address, since the test is one user)."""
    def by_address(sock: socket.socket, address: object) -> str:
        return str(address[0])  # type: ignore[index]

    with _server(key=by_address) as (address, _):
        slow = []
        try:
            for _ in range(MAX_HANDLERS):
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.settimeout(60)
                s.connect(address)
                s.sendall(b"GET /hea")  # and never more
                slow.append(s)
            refused = []
            for s in slow:  # the server answers those over the share at once
                s.settimeout(0.5)
                try:
                    refused.append(s.recv(65536).startswith(b"HTTP/1.1 503"))
                except TimeoutError:
                    refused.append(False)
            assert sum(refused) == MAX_HANDLERS - MAX_PER_CLIENT
            assert _health(address).startswith(b"HTTP/1.1 200")
        finally:
            for s in slow:
                s.close()


def test_the_client_key_is_the_local_user_on_linux() -> None:
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp here")
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=60)
        conn, peer = server.accept()
        with client, conn:
            assert client_key(conn, peer) == f"uid {os.getuid()}"


# ------------------------------------------------------------------ the decisions folder
def test_a_planted_link_in_the_decisions_folder_is_never_followed(tmp_path: Path) -> None:
    """Before: `serve --decisions-dir` appended through a planted symlink to its target."""
    target = tmp_path / "victim.txt"
    target.write_text("keep me\n")
    folder = tmp_path / "decisions"
    folder.mkdir()
    (folder / decisions_file(0)).symlink_to(target)
    with pytest.raises(ValueError, match="already holds decisions-rank0.jsonl"):
        prepare_decisions_dir(folder, 1)
    assert target.read_text() == "keep me\n"


def test_stale_decisions_are_refused_and_a_fresh_folder_is_made(tmp_path: Path) -> None:
    folder = tmp_path / "decisions"
    folder.mkdir()
    (folder / "service.log").write_text("the run's own log may be there\n")
    prepare_decisions_dir(folder, 2)
    assert sorted(p.name for p in folder.iterdir()) == [
        decisions_file(0), decisions_file(1), "service.log"]
    with pytest.raises(ValueError, match="decisions are never appended to"):
        prepare_decisions_dir(folder, 2)  # a second service into the same folder
    fresh = tmp_path / "new" / "d"
    prepare_decisions_dir(fresh, 1)
    assert [p.name for p in fresh.iterdir()] == [decisions_file(0)]
    link = tmp_path / "link"
    link.symlink_to(fresh)
    with pytest.raises(ValueError, match="is a symbolic link"):
        prepare_decisions_dir(link, 1)
