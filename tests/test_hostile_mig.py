"""MIG reconfiguration under a running exporter (issue 26, item 4): after instances are destroyed
between two listings, at most one NVML call per reconfiguration uses a handle of a destroyed
instance (the call that reveals it), the MIG devices are listed again at once, and the series
follow the new layout without waiting for the next slow pass. XIDs naming a MIG instance carry
its MIG UUID."""

from __future__ import annotations

import ctypes
import threading
import time

import pynvml as N

from gpuobs.nvml import Session

H100 = "h100-sxm-80gb"
MIG3 = {"gpus": [{"profile": H100, "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]}]}
FAST = {"interval": 0.05}


def _addr(handle) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class HandleAudit:
    """Wraps Session.call (every NVML call the exporter makes) to count calls made with the handle
    of a destroyed MIG device: a handle the exporter got by index before `destroyed(indexes)` and
    has not got again since."""

    def __init__(self, monkeypatch):
        self.lock = threading.Lock()
        self.by_addr: dict[int, int] = {}  # MIG handle address -> its index when last got
        self.dead: set[int] = set()
        self.stale: list[str] = []  # names of the calls made with a dead handle
        real = Session.call
        audit = self

        def call(session, fn, *args, **kw):
            name = kw.get("name") or getattr(fn, "__name__", "")
            if args and name != "nvmlDeviceGetMigDeviceHandleByIndex":
                with audit.lock:
                    if _addr(args[0]) in audit.dead:
                        audit.stale.append(name)
            out = real(session, fn, *args, **kw)
            if name == "nvmlDeviceGetMigDeviceHandleByIndex":
                with audit.lock:
                    audit.by_addr[_addr(out)] = args[1]
                    audit.dead.discard(_addr(out))  # got again: a handle of the device there now
            return out

        monkeypatch.setattr(Session, "call", call)

    def destroyed(self, indexes: set[int]) -> None:
        with self.lock:
            self.dead |= {a for a, i in self.by_addr.items() if i in indexes}


def instances(scrape) -> set[tuple[str, str]]:
    """{(gpu_instance_id, mig_uuid)} of gpuobs_mig_info."""
    return {(l["gpu_instance_id"], l["mig_uuid"]) for n, l, _ in scrape if n == "gpuobs_mig_info"}


def memory_gis(scrape) -> set[str]:
    return {l["gpu_instance_id"] for n, l, _ in scrape if n == "gpuobs_mig_memory_total_bytes"}


def mid_cycle(run) -> None:
    """Wait until the next pass is far from a slow one (slow passes list the MIG devices anyway)."""
    sampler = run.exp.sampler
    deadline = time.monotonic() + 10
    while sampler.samples % 10 not in (2, 3):
        assert time.monotonic() < deadline, "the sampler stopped"
        time.sleep(0.005)


def test_destroyed_instances_cost_at_most_one_call_each_reconfiguration(make_sim, start, monkeypatch):
    """Every family on (the tests' default), the processes family's per-MIG-device reads included."""
    audit = HandleAudit(monkeypatch)
    sim = make_sim(MIG3, init=False)
    run = start(sim, **FAST)
    st = sim.state
    first = run.wait_for(lambda s: len(instances(s)) == 3, 10, "three MIG devices")
    # 1. the last instance destroyed: the other two keep their handles
    mid_cycle(run)
    gone = st.gpu(0).migs[2].uuid.s.decode()
    audit.destroyed({2})
    st.destroy_migs(0, keep=2)
    kept = {(gi, u) for gi, u in instances(first) if u != gone}
    scrape = run.wait_for(lambda s: len(instances(s)) == 2, 10, "two MIG devices")
    assert run.exp.sampler.samples % 10 not in (0, 1), "seen through a slow pass, not at once"
    assert instances(scrape) == kept
    run.next_snapshot(15)  # past a slow pass
    assert len(audit.stale) <= 1, audit.stale
    # 2. every instance destroyed, then two new ones made (new ids, new UUIDs) at the same indexes
    mid_cycle(run)
    audit.destroyed({0, 1})
    st.destroy_migs(0)
    run.wait_for(lambda s: not instances(s), 10, "no MIG device")
    run.next_snapshot(3)
    new = st.create_migs(0, [11, 12])
    scrape = run.wait_for(lambda s: {u for _, u in instances(s)} == set(new), 10, "the new MIG devices")
    assert memory_gis(scrape) == {"11", "12"}
    run.next_snapshot(15)
    assert len(audit.stale) <= 2, audit.stale  # one per reconfiguration


def test_mig_turned_off_costs_at_most_one_call(make_sim, start, monkeypatch):
    audit = HandleAudit(monkeypatch)
    sim = make_sim(MIG3, init=False)
    run = start(sim, **FAST)
    run.wait_for(lambda s: len(instances(s)) == 3, 10, "three MIG devices")
    mid_cycle(run)
    audit.destroyed({0, 1, 2})
    g = sim.state.gpu(0)
    g.mig_current.base = 0  # MIG off (after the GPU reset that applies it)
    scrape = run.wait_for(lambda s: not instances(s), 10, "no MIG device")
    assert [v for n, _, v in scrape if n == "gpuobs_gpu_mig_enabled"] == [0.0]
    run.next_snapshot(15)
    assert len(audit.stale) <= 1, audit.stale


def test_a_driver_answering_gone_for_a_listed_device_keeps_its_series(make_sim, start):
    """A device that a fresh listing still finds is there: its failing memory read is an answer of
    the driver, not a reconfiguration, so its other series stay and the devices are not listed again
    on every pass."""
    sim = make_sim(MIG3, init=False)
    sim.state.fail("nvmlDeviceGetMemoryInfo_v2", N.NVML_ERROR_INVALID_ARGUMENT)
    sim.state.fail("nvmlDeviceGetMemoryInfo", N.NVML_ERROR_INVALID_ARGUMENT)
    run = start(sim, **FAST)
    run.wait_for(lambda s: len(instances(s)) == 3, 10, "three MIG devices")
    before = sim.state.calls().get("nvmlDeviceGetMigDeviceHandleByIndex", 0)
    run.next_snapshot(20)
    listings = sim.state.calls().get("nvmlDeviceGetMigDeviceHandleByIndex", 0) - before
    max_devices = 7  # H100: nvmlDeviceGetMaxMigDeviceCount
    assert listings <= 3 * max_devices, listings  # the slow passes' listings (and one more), not one per pass
    assert len(instances(run.scrape())) == 3
