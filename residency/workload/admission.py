"""What the service lets in: connections (at most `MAX_HANDLERS` at once, `MAX_PER_CLIENT`
of them from one local user: `BoundedHTTPServer`, `client_key`) and request bodies (`steps`
and `seed` within the bounds of `residency.protocol`: `request_error`)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from residency.protocol import MAX_SEED, MAX_STEPS

MAX_HANDLERS = 16               # concurrent HTTP connections; more get 503 and are closed
MAX_PER_CLIENT = 8              # of those, at most this many from one client (local user)


def short(value: Any) -> str:
    """`repr(value)`, cut to 40 characters, for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def request_error(body: dict[str, Any]) -> str | None:
    """Why a `POST /v1/generate` body is refused (400), or None."""
    steps, seed = body.get("steps"), body.get("seed", 0)
    if (not isinstance(steps, int) or isinstance(steps, bool)
            or not 1 <= steps <= MAX_STEPS):
        return f"`steps` must be an integer in [1, {MAX_STEPS}], got {short(steps)}"
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        return f"`seed` must be an integer in [0, 2**53 - 1], got {short(seed)}"
    return None


def _proc_net_key(sock: socket.socket) -> str | None:
    """The local user of a loopback peer: the uid owning the peer's end of `sock` in
    /proc/net/tcp{,6} (Linux); None when it cannot be told."""
    try:
        peer = sock.getpeername()
        mine = sock.getsockname()
    except OSError:
        return None

    def hexaddr(addr: tuple[Any, ...], v6: bool) -> str:
        packed = ipaddress.ip_address(addr[0]).packed
        if v6:  # four host-order 32-bit words
            words = [packed[i:i + 4][::-1].hex() for i in range(0, 16, 4)]
            return f"{''.join(words).upper()}:{addr[1]:04X}"
        return f"{packed[::-1].hex().upper()}:{addr[1]:04X}"

    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(table, encoding="ascii") as fh:
                lines = fh.read().split("\n")[1:]
            local, remote = hexaddr(peer, v6), hexaddr(mine, v6)
        except (OSError, ValueError):
            continue
        for line in lines:
            f = line.split()
            if len(f) > 7 and f[1] == local and f[2] == remote:
                return f"uid {f[7]}"
    return None


def client_key(sock: socket.socket, address: Any) -> str:
    """Who a connection comes from, for the per-client cap: its local user when the kernel
    says (every client of a loopback service is local; an address in 127/8 is free to pick),
    else its address."""
    return _proc_net_key(sock) or f"address {address[0] if address else '?'}"


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_handlers` at once and `max_per_client` of them
    from one client (`client_key`); the rest get 503 and close."""

    daemon_threads = True
    request_queue_size = 64  # listen backlog: bursts wait in the kernel, not in SYN retries
    BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: 34\r\n\r\n"
            b'{"error": "too many connections"}\n')

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 max_handlers: int = MAX_HANDLERS, max_per_client: int = MAX_PER_CLIENT,
                 key: Callable[[socket.socket, Any], str] = client_key) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_handlers)
        self._per_client: dict[str, int] = {}
        self._per_client_lock = threading.Lock()
        self._max_per_client = max_per_client
        self._key = key
        self._keys: dict[int, str] = {}

    def _refuse(self, request: Any) -> None:
        with contextlib.suppress(OSError):
            request.settimeout(1.0)
            request.sendall(self.BUSY)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        key = self._key(request, client_address)
        with self._per_client_lock:
            if self._per_client.get(key, 0) >= self._max_per_client:
                full = True
            else:
                full = not self._slots.acquire(blocking=False)
                if not full:
                    self._per_client[key] = self._per_client.get(key, 0) + 1
                    self._keys[id(request)] = key
        if full:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def _release(self, request: Any) -> None:
        with self._per_client_lock:
            key = self._keys.pop(id(request), None)
            if key is not None:
                left = self._per_client.get(key, 1) - 1
                if left > 0:
                    self._per_client[key] = left
                else:
                    self._per_client.pop(key, None)
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)
