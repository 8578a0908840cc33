"""Free TCP ports on loopback, for the demo's servers, the benchmarks and the tests (one helper for all)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (the OS's pick for port 0).

    Another process may take it before the caller binds it; callers that start servers on it
    retry or fail with the server's own error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET; typeshed types the address Any
        return port


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
    """n different TCP ports, free on every address when asked, below the kernel's ephemeral range
    (/proc/sys/net/ipv4/ip_local_port_range): a server that binds all addresses (torch's TCPStore)
    a few seconds later cannot then collide with an outgoing connection's port, or with one left in
    TIME_WAIT by a burst of short connections, which take their ports from that range. Each port is
    held until all are picked, so no two are the same. RuntimeError when none can be found."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = random.sample(range(10000, max(low, 10000 + 4 * n)), min(2000, max(low, 10000 + 4 * n) - 10000))
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            sock = socket.socket()
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            if len(socks) == n:
                return [s.getsockname()[1] for s in socks]
        raise RuntimeError(f"no {n} free ports below {low}")
    finally:
        for sock in socks:
            sock.close()
