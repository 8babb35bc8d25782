"""The service's HTTP front end: each request read within its limits (per read, whole
headers, whole body, body size), body framing that can be read only one way, and the two
routes (`GET /health`, `POST /v1/generate`) handed to the service."""

from __future__ import annotations

import io
import json
import select
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from residency.workload.admission import short

READ_TIMEOUT_S = 10.0           # per socket read/write of the HTTP front end
HEADER_TIMEOUT_S = 10.0         # a request line and all its headers must arrive within this
BODY_TIMEOUT_S = 30.0           # a whole request body must arrive within this
MAX_BODY_BYTES = 1 << 20


class _BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each socket read bounded by `READ_TIMEOUT_S` and, while a
    request's line and headers are read, by the whole-header deadline too (a client that
    trickles one byte every few seconds cannot hold a handler for longer)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        timeout = READ_TIMEOUT_S
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"request headers not complete within {HEADER_TIMEOUT_S:g} s")
            timeout = min(timeout, left)
        self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


def request_handler(service: Any) -> type[BaseHTTPRequestHandler]:
    """The handler class serving `service` (its `health()` and `generate(body, client_gone)`)."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S  # every socket read and write; an idle keep-alive closes

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the plain makefile() reader: replaced by a bounded one
            self._reader = _DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            # the request line and headers of each request (keep-alive too) within one
            # deadline; the body has its own (`BODY_TIMEOUT_S`)
            self._reader.deadline = time.monotonic() + HEADER_TIMEOUT_S
            super().handle_one_request()

        def parse_request(self) -> bool:
            ok = super().parse_request()
            self._reader.deadline = None
            return ok

        def _framing_error(self) -> tuple[int, str] | None:
            """A request whose body framing could be read two ways (request smuggling)."""
            if self.headers.get_all("Transfer-Encoding"):
                return 501, "Transfer-Encoding is not supported: send a Content-Length body"
            if len(self.headers.get_all("Content-Length") or []) > 1:
                return 400, "more than one Content-Length header"
            return None

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write(f"[http] {self.address_string()} {fmt % args}\n")

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _read_body(self) -> bytes:
            raw = self.headers.get("Content-Length")
            if raw is None:
                return b""
            if not raw.strip().isdigit() or not raw.strip().isascii():
                raise _BadRequest(400, f"Content-Length must be a non-negative integer, "
                                       f"got {short(raw)}")
            length = int(raw.strip())
            if length > MAX_BODY_BYTES:
                raise _BadRequest(413, f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
            deadline = time.monotonic() + BODY_TIMEOUT_S
            chunks, remaining = [], length
            while remaining:
                if time.monotonic() > deadline:
                    raise _BadRequest(408, f"body not received within {BODY_TIMEOUT_S:g} s")
                try:
                    chunk = self.rfile.read1(min(remaining, 65536))
                except TimeoutError:
                    raise _BadRequest(408, f"no body data for {READ_TIMEOUT_S:g} s") from None
                if not chunk:
                    raise _BadRequest(400, f"body ended after {length - remaining} of "
                                           f"{length} bytes (Content-Length)")
                chunks.append(chunk)
                remaining -= len(chunk)
            return b"".join(chunks)

        def _client_gone(self) -> bool:
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except (OSError, ValueError):
                return True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            framing = self._framing_error()
            if framing is not None or self.headers.get("Content-Length") not in (None, "0"):
                self.close_connection = True  # a body we do not read: never a next request
            if framing is not None:
                self._send(framing[0], {"error": framing[1]})
                return
            if self.path == "/health":
                self._send(*service.health())
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            framing = self._framing_error()
            if framing is not None:
                self.close_connection = True
                self._send(framing[0], {"error": framing[1]})
                return
            try:
                data = self._read_body()
            except _BadRequest as exc:
                self.close_connection = True  # the stream position is unknown
                self._send(exc.code, {"error": str(exc)})
                return
            if self.path != "/v1/generate":
                self._send(404, {"error": f"no route {self.path}"})
                return
            try:
                body = json.loads(data or b"null")
                if not isinstance(body, dict):
                    raise ValueError("body must be a JSON object")
            except (ValueError, RecursionError) as exc:
                self._send(400, {"error": f"invalid JSON body: {exc}"})
                return
            code, payload = service.generate(body, client_gone=self._client_gone)
            if code == 499:  # nobody to answer
                self.close_connection = True
                return
            self._send(code, payload)

    return Handler
