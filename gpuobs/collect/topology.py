"""Topology: per pair of GPUs on the node the closest path between them (NVLink straight to the
peer, through NVSwitches, or the PCIe path) and its NVLink link count (detail), each GPU's NVLink
domain (the lowest index it shares NVLink with: one series standing in for the pairs by default),
and each GPU's NUMA node and CPU affinity, as `nvidia-smi topo -m` shows them. Read at probe (the
wiring is fixed for the GPUs' life; re-read after NVML re-initialises and every Session.reprobe_after
seconds). The NVLink P2P status of each pair is asked again when the GPU's NVLink link states (read
by the nvlink family in the batch) change, or on slow samples without them; a change re-reads the whole topology (a link
that went down takes its pairs off NVLink). A peer the last pass read at another index (the shift
after a GPU leaves the count) or a GPU read that is not among the peers re-reads the topology at
once, not at the next re-probe. A peer the driver reports lost (GPU_IS_LOST) or no longer counts
(GpuCtx.lost, from the sampler's latest read) has no pair series from the pass that finds it so,
and has them again once it answers; a peer whose read timed out keeps its pairs: it is still there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml as N

from .. import catalog as c
from .base import Family, GpuCtx, Sample, register

MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS: links are asked for until one answers none
CPU_WORDS = 16  # 64-bit words of the affinity mask asked for: 1024 logical CPUs
SWITCH = getattr(N, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
P2P_NVLINK = getattr(N, "NVML_P2P_CAPS_INDEX_NVLINK", 2)  # pynvml 11.4.1 lacks the P2P constants
P2P_OK = getattr(N, "NVML_P2P_STATUS_OK", 0)


def _nvml(name: str) -> Callable[..., Any]:
    """pynvml's function of that name, looked up now; one an older binding lacks (11.4.1 has no
    nvmlDeviceGetNumaNodeId) answers FUNCTION_NOT_FOUND, which GpuCtx.get remembers as unavailable."""
    fn: Callable[..., Any] | None = getattr(N, name, None)
    if fn is not None:
        return fn

    def missing(*_args: Any) -> Any:
        raise N.NVMLError(N.NVML_ERROR_FUNCTION_NOT_FOUND)
    missing.__name__ = name
    return missing


@dataclass(frozen=True)
class Peer:
    """Another GPU of the node: its NVML index, UUID, handle and PCI bus id (NVML's form)."""
    index: int
    uuid: str
    handle: Any
    bus_id: str


@dataclass
class TopologyState:
    """One GPU's topology as last probed: its peers, each pair's NVLink P2P answer, the pair series'
    label values and NVLink link counts (same order), its NUMA node and CPU list (None: not reported)."""
    peers: list[Peer] = field(default_factory=list)
    p2p: dict[str, bool | None] = field(default_factory=dict)  # peer UUID -> NVLink P2P status (None: unknown)
    pairs: list[tuple[str, ...]] = field(default_factory=list)  # label values after the GPU's own, per peer
    counts: list[int] = field(default_factory=list)  # NVLink links per pair, in pairs' order
    numa: int | None = None
    cpus: str | None = None
    domain: int | None = None  # lowest index of this GPU and its NVLink peers (gpuobs_gpu_topology_nvlink_domain)
    links: tuple[float, ...] | None = None  # NVLink link states (field values) when P2P was last asked
    # the GPUs read (UUID, index) that last made collect() re-probe
    moved_for: frozenset[tuple[str, int]] | None = None


def cpu_list(words: Any) -> str:
    """A CPU bitmask (64-bit words, CPU 0 the lowest bit of the first) as a Linux CPU list: "0-55,112-167"."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
    ranges: list[list[int]] = []
    for cpu in cpus:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def _peers(gpu: GpuCtx) -> list[Peer]:
    """The node's other GPUs; one that cannot be looked up (lost, unreadable) is left out."""
    session = gpu.session
    try:
        count = session.call(N.nvmlDeviceGetCount, name="nvmlDeviceGetCount_v2")
    except N.NVMLError:
        return []
    peers = []
    for index in range(count):
        if index == gpu.index:
            continue
        try:
            handle = session.call(N.nvmlDeviceGetHandleByIndex, index, name="nvmlDeviceGetHandleByIndex_v2")
            uuid = session.call(N.nvmlDeviceGetUUID, handle)
            bus_id = session.call(N.nvmlDeviceGetPciInfo_v3, handle).busId
        except (N.NVMLError, UnicodeDecodeError, ValueError, TypeError):
            continue
        if uuid != gpu.uuid:
            peers.append(Peer(index, uuid, handle, bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)))
    return peers


def _links(gpu: GpuCtx) -> tuple[dict[str, int], int]:
    """This GPU's active NVLink links: ({peer PCI bus id: links straight to it}, links into NVSwitches)."""
    direct: dict[str, int] = {}
    switch = 0
    for link in range(MAX_LINKS):
        state = gpu.get(_nvml("nvmlDeviceGetNvLinkState"), link, expected=(N.NVML_ERROR_INVALID_ARGUMENT,))
        if state is None:
            break  # past the last link, or no NVLink
        if state != N.NVML_FEATURE_ENABLED:
            continue
        if gpu.get(_nvml("nvmlDeviceGetNvLinkRemoteDeviceType"), link) == SWITCH:
            switch += 1
            continue
        remote = gpu.get(_nvml("nvmlDeviceGetNvLinkRemotePciInfo"), link, name="nvmlDeviceGetNvLinkRemotePciInfo_v2")
        if remote is not None:
            bus = remote.busId.decode() if isinstance(remote.busId, bytes) else str(remote.busId)
            direct[bus.upper()] = direct.get(bus.upper(), 0) + 1
    return direct, switch


# A pair call answers for both GPUs: a lost (or reset-needing) peer makes it fail with the peer's
# code, which must not mark this GPU unusable. Those codes give None here; this GPU's own calls
# still report its own loss.
PEER_GONE = (N.NVML_ERROR_GPU_IS_LOST, N.NVML_ERROR_RESET_REQUIRED)


def _p2p(gpu: GpuCtx, peer: Peer) -> bool | None:
    """Whether the driver reports an NVLink P2P path to the peer (None: it cannot tell, or the peer
    is gone)."""
    status = gpu.get(_nvml("nvmlDeviceGetP2PStatus"), peer.handle, P2P_NVLINK, expected=PEER_GONE)
    return None if status is None else status == P2P_OK


def _pair(gpu: GpuCtx, peer: Peer, p2p: bool | None, direct: dict[str, int],
          switch: int) -> tuple[tuple[str, ...], int]:
    """(label values after the GPU's own, NVLink links) of one pair. Without a P2P answer the links
    decide: straight to the peer, or into NVSwitches (assumed to reach it)."""
    level = gpu.get(_nvml("nvmlDeviceGetTopologyCommonAncestor"), peer.handle, expected=PEER_GONE)
    pcie = c.TOPOLOGY_PCIE_PATHS.get(level, "") if level is not None else ""
    links, kind = direct.get(peer.bus_id.upper(), 0), "nvlink"
    if not links and switch:
        links, kind = switch, "nvswitch"
    if p2p and not links:  # the driver reports an NVLink path but not over which links: at least one
        links, kind = 1, "nvlink"
    if p2p is False or not links:
        links, kind = 0, pcie or "unknown"
    return (str(peer.index), peer.uuid, kind, pcie), links


@register("topology", summary="GPU pairs' NVLink/PCIe paths, NUMA node and CPU affinity")
class Topology(Family):
    """Absent pairs on a single-GPU node; the NUMA node and CPU affinity where NVML reports them."""
    State = TopologyState

    def __init__(self) -> None:
        super().__init__()
        self._reading: dict[str, int] = {}  # UUID -> index of the GPUs collected in the pass under way
        self._read: dict[str, int] | None = None  # ... in the last complete pass (None: none yet)

    def probe(self, gpu: GpuCtx) -> None:
        """Reads the GPU's peers, each pair's NVLink P2P status, path and NVLink link count, its NVLink
        domain, NUMA node (nvmlDeviceGetNumaNodeId; -1 reads as none) and CPU affinity (only where served)."""
        st = self.state(gpu)
        st.peers = _peers(gpu)
        st.p2p = {p.uuid: _p2p(gpu, p) for p in st.peers}
        direct, switch = _links(gpu) if st.peers else ({}, 0)
        pairs = [_pair(gpu, p, st.p2p[p.uuid], direct, switch) for p in st.peers]
        st.pairs, st.counts = [labels for labels, _ in pairs], [links for _, links in pairs]
        st.domain = min([gpu.index] + [p.index for p, links in zip(st.peers, st.counts) if links])
        numa = gpu.get(_nvml("nvmlDeviceGetNumaNodeId"))
        st.numa = numa if isinstance(numa, int) and numa >= 0 else None  # -1: no NUMA information
        mask = gpu.get(_nvml("nvmlDeviceGetCpuAffinity"), CPU_WORDS) if gpu.serves(c.CPU_AFFINITY) else None
        st.cpus = cpu_list(mask) if mask is not None else None

    def collect(self, gpu: GpuCtx) -> None:
        """Probes again when the NVLink link states moved and a pair's P2P answer changed, or when the last
        pass read GPUs at other indexes than the probe found; then emits the pair series for peers not lost, and
        the GPU's domain, NUMA node and CPU affinity."""
        st = self.state(gpu)
        links = tuple(v for (fid, _), v in gpu.fields.items() if fid == N.NVML_FI_DEV_NVLINK_GET_STATE)
        moved, st.links = links != st.links, links
        # without link states (nvlink family off): slow samples, where a pair is on NVLink to lose
        if (moved or (gpu.slow and not links and any(st.counts))) and st.peers and \
                any(_p2p(gpu, p) != st.p2p.get(p.uuid) for p in st.peers):
            self.probe(gpu)
        self._reading[gpu.uuid] = gpu.index
        read = self._read
        if read is not None and _moved(gpu, st.peers, read) and st.moved_for != (key := frozenset(read.items())):
            st.moved_for = key  # once per set of GPUs read: a peer the probe cannot look up is not re-read each pass
            self.probe(gpu)
        for peer, labels, links in zip(st.peers, st.pairs, st.counts):
            if peer.uuid not in gpu.lost:  # back: the same pair again (or the re-probe _moved asks for)
                gpu.emit(c.TOPOLOGY_NVLINK, links, *labels)
        gpu.emit(c.NUMA_NODE, st.numa)
        gpu.emit(c.NVLINK_DOMAIN, st.domain)
        if st.cpus:
            gpu.emit(c.CPU_AFFINITY, 1, st.cpus)

    def node_samples(self, known: dict[str, int]) -> list[Sample]:
        """No samples: the end of a pass, when the GPUs it read become the ones pairs are served for."""
        self._read, self._reading = self._reading, {}
        return []


def _moved(gpu: GpuCtx, peers: list[Peer], read: dict[str, int]) -> bool:
    """True if the last pass read a peer at another index than the probe found it at, or read a GPU
    the probe did not find (back from loss, or new): the pairs' labels are then wrong."""
    at = {p.uuid: p.index for p in peers}
    return any(read.get(uuid, index) != index for uuid, index in at.items()) or \
        any(uuid not in at for uuid in read if uuid != gpu.uuid)
