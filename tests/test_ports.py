"""gpuobs.ports: the ports it hands out are free, distinct and outside the kernel's ephemeral range
(where any outgoing connection may take them before the server binds)."""

from __future__ import annotations

import socket

from gpuobs import ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    low = ports._ephemeral_low()
    picked = ports.free_ports(20) + [ports.free_port()]
    assert len(set(picked[:20])) == 20
    assert all(ports.LOWEST <= p < low and _bindable(p) for p in picked)
    base = ports.free_port_run(3)
    assert ports.LOWEST <= base and base + 2 < low and all(_bindable(p) for p in range(base, base + 3))


def test_a_taken_port_is_never_handed_out(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("", 0))
        free = probe.getsockname()[1]  # free once the probe closes
    with socket.socket() as held:
        held.bind(("", 0))
        taken = held.getsockname()[1]
        # every candidate is the taken port but one: only that one can come back
        monkeypatch.setattr(ports._random, "sample", lambda population, k: [taken, taken, free])
        assert ports.free_ports(1) == [free]


def test_a_seeded_random_module_does_not_repeat_the_ports():
    """Frameworks seed the random module (transformers' set_seed): the picks must not follow it."""
    import random

    random.seed(42)
    first = ports.free_ports(5)
    random.seed(42)
    assert ports.free_ports(5) != first
