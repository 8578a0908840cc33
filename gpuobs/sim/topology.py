"""Node topology of a simulated node: which GPUs NVLink joins, the PCIe path between each pair,
each GPU's NUMA node and CPU affinity (what nvidia-smi topo -m prints).

```yaml
topology:                  # optional; a kind alone also works: `topology: pcie`
  kind: nvswitch           # nvswitch | nvlink-pairs | pcie (default: nvswitch where GPUs have NVLink)
  sockets: 2               # CPU sockets (NUMA nodes), GPUs split evenly in slot order
  cores_per_socket: 56     # CPU cores a socket has; each has 2 hardware threads
```

The kinds, from NVIDIA's published `nvidia-smi topo -m` outputs (the shared captures show no topology):
- nvswitch: DGX/HGX H100 and A100 boards. Every NVLink of every GPU goes into the NVSwitches, so
  every pair prints NV18 (H100) or NV12 (A100); GPUs 2k and 2k+1 share a PCIe switch tree (PXB),
  the others on a socket meet at the CPU (NODE), across sockets SYS.
- nvlink-pairs: PCIe cards joined two by two by NVLink bridges (H100 NVL, A100 PCIe with bridges):
  GPUs 2k and 2k+1 reach each other over their bridge (NV12 on H100 NVL) and share a PCIe switch
  (PIX); every other pair has only PCIe.
- pcie: PCIe cards without NVLink (L40S servers): PIX for 2k and 2k+1, else NODE or SYS.
"""

from __future__ import annotations

from typing import Any

from . import layout
from .state import SimState, set_val

KINDS = ("nvswitch", "nvlink-pairs", "pcie")
NVSWITCH_DEVICE = 2  # nvmlIntNvLinkDeviceType_t: NVML_NVLINK_DEVICE_TYPE_SWITCH
# nvmlGpuTopologyLevel_t: SINGLE (PIX), MULTIPLE (PXB), NODE, SYSTEM
SINGLE, MULTIPLE, NODE, SYSTEM = 10, 20, 40, 50


class TopologyError(ValueError):
    """A topology entry that cannot be applied; the message names what is wrong."""


def _options(spec: Any, slots: int, has_nvlink: bool) -> tuple[str, int, int]:
    """(kind, sockets, cores per socket) of a scenario's `topology` entry (None, a kind or a mapping)."""
    entry = {"kind": spec} if isinstance(spec, str) or spec is None else spec
    if not isinstance(entry, dict):
        raise TopologyError(f"topology must be a kind ({', '.join(KINDS)}) or a mapping, got {spec!r}")
    kind = entry.get("kind") or ("nvswitch" if has_nvlink else "pcie")
    if kind not in KINDS:
        raise TopologyError(f"unknown topology kind {kind!r}; use {', '.join(KINDS)}")
    sockets = entry.get("sockets", 2 if slots > 1 else 1)
    cores = entry.get("cores_per_socket", 56)
    for name, value in (("sockets", sockets), ("cores_per_socket", cores)):
        if not isinstance(value, int) or value < 1:
            raise TopologyError(f"topology {name} must be an integer >= 1, got {value!r}")
    if sockets * cores * 2 > layout.CPU_WORDS * 64:
        raise TopologyError(f"topology: {sockets * cores * 2} CPU threads exceed {layout.CPU_WORDS * 64}")
    return kind, sockets, cores


def _affinity(g: layout.Gpu, socket: int, sockets: int, cores: int) -> None:
    """The socket's cores and their second hardware threads (numbered after every socket's cores)."""
    for word in range(layout.CPU_WORDS):
        g.cpu_affinity[word] = 0
    for cpu in [*range(socket * cores, (socket + 1) * cores),
                *range((sockets + socket) * cores, (sockets + socket + 1) * cores)]:
        g.cpu_affinity[cpu // 64] |= 1 << (cpu % 64)


def _level(kind: str, a: int, b: int, socket: list[int]) -> int:
    if a // 2 == b // 2:
        return MULTIPLE if kind == "nvswitch" else SINGLE
    return NODE if socket[a] == socket[b] else SYSTEM


def _links(st: SimState, kind: str, slot: int, slots: int) -> None:
    """Point the GPU's NVLink links where the kind says: NVSwitch ports, its bridge peer, or none."""
    g = st.s.gpus[slot]
    peer = slot ^ 1
    if kind == "pcie" or (kind == "nvlink-pairs" and peer >= slots):
        g.link_count = 0
        return
    for link in g.links[: g.link_count]:
        if kind == "nvswitch":
            link.remote_type = NVSWITCH_DEVICE
        else:
            link.remote_type = 0
            link.remote_bus_id.s, link.remote_bus_id.ret = st.s.gpus[peer].bus_id.s, 0


def apply(st: SimState, spec: Any, slots: int) -> None:
    """Write the topology of the scenario's `topology` entry (see the module doc) into the first
    `slots` GPU slots, after their profiles. Raises TopologyError for an entry it cannot apply."""
    has_nvlink = any(st.s.gpus[i].link_count for i in range(slots))
    kind, sockets, cores = _options(spec, slots, has_nvlink)
    socket = [i * sockets // slots for i in range(slots)]
    for a in range(slots):
        g = st.s.gpus[a]
        set_val(g.numa_node, socket[a])
        _affinity(g, socket[a], sockets, cores)
        for b in range(slots):
            g.topo_level[b] = 0 if a == b else _level(kind, a, b, socket) + 1  # stored + 1: 0 is "not modelled"
        _links(st, kind, a, slots)
