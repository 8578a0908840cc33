"""Free TCP ports on loopback, for the demo's servers, the benchmarks and the tests (one helper for all).

Every port is picked below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), at
random: the OS takes an outgoing connection's local port from that range, so a port picked there
(as binding port 0 does) can be taken by any client connection, or held in TIME_WAIT by a burst of
short ones, in the seconds before the server that was given it binds it. Below the range, only
another picker can collide, and the random choice makes that unlikely when many run at once."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000  # below: well-known and registered ports that local services (9090, 9093, ...) use
# The OS's randomness, not the random module's: a library that seeds that (transformers' set_seed,
# every Trainer) would hand every later picker in the process, and in its peers, the same ports.
_random = random.SystemRandom()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind_all(ports: range | list[int]) -> list[socket.socket] | None:
    """Sockets bound to each of ports on every address, or None (all closed) if one is taken."""
    socks: list[socket.socket] = []
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            for s in socks:
                s.close()
            return None
        socks.append(sock)
    return socks


def free_port() -> int:
    """A TCP port free on every address when asked, below the ephemeral range.

    Another process may take it before the caller binds it; callers that start servers on it
    retry or fail with the server's own error. RuntimeError when none can be found."""
    return free_ports(1)[0]


def free_port_run(n: int) -> int:
    """The first of n consecutive ports that were all free on every address when asked, below the
    ephemeral range (as ranks serving on base + local rank need). RuntimeError after 200 tries."""
    high = max(_ephemeral_low(), LOWEST + 4 * n) - n
    for _ in range(200):
        base = _random.randrange(LOWEST, high)
        socks = _bind_all(range(base, base + n))
        if socks is not None:
            for sock in socks:
                sock.close()
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def free_ports(n: int) -> list[int]:
    """n different TCP ports, free on every address when asked, below the ephemeral range: a server
    that binds all addresses (torch's TCPStore) a few seconds later cannot then collide with an
    outgoing connection's port. Each port is held until all are picked, so no two are the same.
    RuntimeError when none can be found."""
    low = max(_ephemeral_low(), LOWEST + 4 * n)
    candidates = _random.sample(range(LOWEST, low), min(2000, low - LOWEST))
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            found = _bind_all([port])
            if found is None:
                continue
            socks += found
            if len(socks) == n:
                return [s.getsockname()[1] for s in socks]
        raise RuntimeError(f"no {n} free ports below {low}")
    finally:
        for sock in socks:
            sock.close()
