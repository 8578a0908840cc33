"""Free TCP ports on loopback, for the demo's servers, the benchmarks and the tests (one helper for all)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (the OS's pick for port 0).

    Another process may take it before the caller binds it; callers that start servers on it
    retry or fail with the server's own error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int) -> int:
    """The first of n consecutive ports on 127.0.0.1 that were all free (as ranks serving on base +
    local rank need). RuntimeError after 100 tries without such a run."""
    for _ in range(100):
        base = free_port()
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def free_ports(n: int) -> list[int]:
    """n different TCP ports on 127.0.0.1 that were free when asked: each is held until all are
    picked, so two of them are never the same port (as separate free_port() calls may be)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()
