"""Scenarios: a simulated node described in YAML, written into a state file.

```yaml
driver_version: "590.48.01"      # optional
cuda_version: "13.1"             # optional
driver: r470                      # optional: an older driver's symbol set for child processes
                                  # (gpuobs.sim.builder.DRIVERS); also its version strings by default
gpus:
  - profile: h100-sxm-80gb        # a built-in profile (gpuobs.sim.profiles) ...
    count: 8
    behaviour: steady             # idle | steady | ramp | noise (default idle)
    period_s: 300                 # ramp length / noise interval
    mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]   # optional MIG layout
    overrides: {power_w: {limit: 600}}          # deep-merged into the profile
  - capture: shared/captures/linux-x86_64__nvidia-h200__590.48.01.txt   # ... or a real capture
    phase: load                   # idle | load
    synthesize: [energy]          # optional: energy, nvlink_counters (made up: a capture shows neither)
processes:                        # optional, per GPU slot
  - {gpu: 0, pid: 4242, name: python train.py, used_mib: 30000, sm_util: 90}
topology: nvswitch                # optional: nvswitch | nvlink-pairs | pcie, or a mapping (gpuobs.sim.topology)
```
Relative capture paths resolve against the scenario file's folder, then the current directory.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from . import builder, layout, profiles, topology
from .layout import Gpu, Val
from .state import SimState, set_counter, set_val

MIB = 1024 * 1024
NO_ID = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process outside MIG
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE: usedGpuMemory the driver cannot tell (WDDM)
NO_SAMPLE = 0xFFFFFFFF  # Proc.sm_util of a process without a utilization sample: the simulator skips it

ARCHITECTURES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7,
                 "ada lovelace": 8, "ada": 8, "hopper": 9, "blackwell": 10}
BRANDS = {"quadro": 1, "tesla": 2, "nvs": 3, "geforce": 5, "titan": 6, "quadro rtx": 12,
          "nvidia rtx": 13, "nvidia": 14}
CLOCKS = ("graphics", "sm", "memory", "video")  # nvmlClockType_t order
THRESHOLDS = {"shutdown": 0, "slowdown": 1, "memory_max": 2, "gpu_max": 3}  # nvmlTemperatureThresholds_t
# violation_ns slots: nvmlPerfPolicyType_t (0 power, 1 thermal policy, 2 sync boost), plus 6/7/8 (no
# policy) for the HW thermal, HW power brake and SW thermal slowdown clock-event counters: NVML keeps
# the thermal policy's violation time apart from the SW thermal slowdown counter, and DCGM reads the former
POLICIES = {"power": 0, "thermal": 1, "sync_boost": 2, "hw_thermal": 6, "hw_power_brake": 7, "sw_thermal": 8}
GPM_SLOT = {name: i for i, name in enumerate(layout.GPM_METRICS.values())}
# GPU instance ids as NVIDIA places them on an H100/A100, first free one per profile size.
GI_IDS = {1: [7, 8, 9, 10, 11, 12, 13], 2: [3, 4, 5], 3: [1, 2], 4: [1], 7: [0]}
MIG_SMS = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}
HGX_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]  # an HGX H100 board's, then the rest
BUSES = HGX_BUSES + [b for b in range(0x01, 0x100) if b not in HGX_BUSES]
MIG_MEMORY_MIB = {10: 9984, 20: 20096, 40: 40448, 80: 80768}  # H100 80GB, from the MIG capture
# Values the simulator makes up where its source shows none: a built-in profile (no "synthesize" key) gets
# them all; a capture (which prints neither) none, unless its entry lists them in `synthesize`.
SYNTHESIZABLE = ("energy", "nvlink_counters")


class ScenarioError(ValueError):
    """A scenario that cannot be applied; the message names the offending entry."""


def _num(v: Val, value: Any, scale: float = 1.0) -> None:
    set_val(v, None if value is None else float(value) * scale)


def _str(s: layout.Str, value: str | bytes | None) -> None:
    if value is None:
        s.ret = 3
        return
    raw = value if isinstance(value, bytes) else value.encode()
    s.s = raw[: layout.STR_LEN - 1]
    s.ret = 0


def _sub(profile: dict, key: str) -> dict:
    value = profile.get(key)
    return value if isinstance(value, dict) else {}


def _identity(g: Gpu, p: dict, slot: int, node: str) -> None:
    _str(g.name, p.get("name"))
    uuid = p.get("uuid")
    if not uuid or set(uuid.replace("GPU-", "").replace("-", "")) <= {"0"}:  # masked in captures
        h = hashlib.sha1(f"{node}/{slot}".encode()).hexdigest()
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    _str(g.uuid, uuid)
    serial = p.get("serial")
    _str(g.serial, None if serial is None else f"{serial[:-3]}{slot:03d}" if len(serial) > 3 else serial)
    _str(g.vbios, p.get("vbios"))
    _str(g.board_part, p.get("board_part_number"))
    _str(g.inforom_image, p.get("inforom_image"))
    brand = p.get("brand")
    _num(g.brand, None if brand is None else BRANDS.get(str(brand).lower(), 0))
    arch = p.get("architecture")
    _num(g.arch, None if arch is None else ARCHITECTURES.get(str(arch).lower(), 0xFFFFFFFF))
    minor = p.get("minor_number")
    _num(g.minor, slot if minor is None else minor + slot)
    cc = p.get("compute_capability") or [None, None]
    _num(g.cc_major, cc[0])
    _num(g.cc_minor, cc[1])
    _num(g.persistence, p.get("persistence_mode"))
    _num(g.compute_mode, p.get("compute_mode"))
    _num(g.num_cores, p.get("cores"))
    pci = _sub(p, "pci")
    # The capture's bus (expand() moves copies of one GPU to free buses); built-in profiles have none.
    bus = BUSES[slot] if pci.get("bus") is None else pci["bus"]
    domain, device = pci.get("domain") or 0, pci.get("device") or 0
    _str(g.bus_id, pci.get("bus_id") or f"{domain:08X}:{bus:02X}:{device:02X}.0")
    _num(g.pci_domain, domain)
    _num(g.pci_bus, bus)
    _num(g.pci_device, device)
    _num(g.pci_device_id, pci.get("device_id"))
    _num(g.pci_subsystem_id, pci.get("subsystem_id"))


def _memory(g: Gpu, p: dict) -> None:
    mem, bar1 = _sub(p, "memory_mib"), _sub(p, "bar1_mib")
    _num(g.mem_total, mem.get("total"), MIB)
    _num(g.mem_reserved, mem.get("reserved"), MIB)
    _num(g.mem_used, mem.get("used"), MIB)
    _num(g.bar1_total, bar1.get("total"), MIB)
    _num(g.bar1_used, bar1.get("used"), MIB)


def _power_thermal_clocks(g: Gpu, p: dict) -> None:
    util, power, temp = _sub(p, "utilization_pct"), _sub(p, "power_w"), _sub(p, "temperature_c")
    _num(g.util_gpu, util.get("gpu"))
    _num(g.util_mem, util.get("memory"))
    _num(g.util_enc, util.get("encoder"))
    _num(g.util_dec, util.get("decoder"))
    draw = power.get("draw") if power.get("draw") is not None else power.get("average")
    _num(g.power_mw, draw, 1000)
    _num(g.power_avg_mw, power.get("average"), 1000)
    _num(g.power_limit_mw, power.get("limit"), 1000)
    _num(g.enforced_limit_mw, power.get("enforced_limit", power.get("limit")), 1000)
    _num(g.default_limit_mw, power.get("default_limit"), 1000)
    _num(g.min_limit_mw, power.get("min_limit"), 1000)
    _num(g.max_limit_mw, power.get("max_limit"), 1000)
    if "nvmlDeviceGetTotalEnergyConsumption" in p.get("unsupported", []) or draw is None \
            or "energy" not in p.get("synthesize", SYNTHESIZABLE):
        set_val(g.energy_mj, None)  # a capture shows no energy counter: absent unless asked to synthesize it
    else:  # energy since driver load: start at an hour's worth, growing at the draw
        set_val(g.energy_mj, draw * 3600 * 1000, "counter", amp=draw * 1000)
    _num(g.temp_gpu, temp.get("gpu"))
    _num(g.temp_mem, temp.get("memory"))
    _num(g.temp_margin, temp.get("margin"))
    for i in range(8):
        set_val(g.temp_threshold[i], None)
    for name, i in THRESHOLDS.items():
        _num(g.temp_threshold[i], temp.get(name))
    clocks, maxc = _sub(p, "clocks_mhz"), _sub(p, "max_clocks_mhz")
    for i, name in enumerate(CLOCKS):
        _num(g.clock[i], clocks.get(name))
        _num(g.max_clock[i], maxc.get(name))
    _num(g.pstate, p.get("pstate"))
    fan = p.get("fan_speed_pct")
    _num(g.fan_count, None if fan is None else 1)
    _num(g.fan[0], fan)
    _num(g.clock_events, p.get("clock_event_reasons"))
    _num(g.clock_events_supported, None if p.get("clock_event_reasons") is None else 0x1FF)
    viol = p.get("violation_us")
    for i in range(layout.PERF_POLICIES):
        set_val(g.violation_ns[i], None if viol is None else 0.0, "counter")
    for name, i in POLICIES.items():
        if viol is not None and name in viol:  # one a profile leaves out stays 0 (nvidia-smi prints no thermal policy)
            set_val(g.violation_ns[i], None if viol.get(name) is None else viol[name] * 1000.0, "counter")


def _pcie_ecc(g: Gpu, p: dict) -> None:
    pcie = _sub(p, "pcie")
    _num(g.pcie_gen, pcie.get("gen"))
    _num(g.pcie_max_gen, pcie.get("max_gen"))
    _num(g.pcie_gpu_max_gen, pcie.get("gpu_max_gen", pcie.get("max_gen")))
    _num(g.pcie_width, pcie.get("width"))
    _num(g.pcie_max_width, pcie.get("max_width"))
    _num(g.pcie_replay, pcie.get("replay"))
    for v, key in ((g.pcie_tx_bytes, "tx_kbps"), (g.pcie_rx_bytes, "rx_kbps")):
        rate = pcie.get(key)
        set_val(v, None if rate is None else 0.0, "counter", amp=(rate or 0) * 1000.0)
    ecc = _sub(p, "ecc")
    _num(g.ecc_current, ecc.get("mode"))
    _num(g.ecc_pending, ecc.get("pending"))
    for i, key in enumerate(("corrected_volatile", "corrected_aggregate",
                             "uncorrected_volatile", "uncorrected_aggregate")):
        set_val(g.ecc[i], ecc.get(key), "counter")
    retired = p.get("retired_pages") or {}
    _num(g.retired_sbe, retired.get("sbe"))
    _num(g.retired_dbe, retired.get("dbe"))
    _num(g.retired_pending, retired.get("pending"))
    remap = p.get("remapped_rows") or {}
    _num(g.remap_cor, remap.get("correctable"))
    _num(g.remap_unc, remap.get("uncorrectable"))
    _num(g.remap_pending, remap.get("pending"))
    _num(g.remap_failure, remap.get("failure"))


ECC_LOCATIONS = ("sram", "dram")  # ecc_location slots: location * 4 + error type * 2 + counter type
REMAP_HISTOGRAM = ("max", "high", "partial", "low", "none")  # nvmlRowRemapperHistogramValues_t order


def _codec_ecc_fabric(g: Gpu, p: dict) -> None:
    """Memory power, encoder and FBC session stats, ECC errors per memory location, the row-remapper
    bank histogram and the NVSwitch fabric registration (None or absent: NOT_SUPPORTED)."""
    _num(g.power_mem_mw, _sub(p, "power_w").get("memory_average"), 1000)
    for prefix, key in (("enc", "encoder_stats"), ("fbc", "fbc_stats")):
        stats = _sub(p, key)
        _num(getattr(g, f"{prefix}_sessions"), stats.get("sessions"))
        _num(getattr(g, f"{prefix}_fps"), stats.get("average_fps"))
        _num(getattr(g, f"{prefix}_latency_us"), stats.get("average_latency_us"))
    ecc = _sub(p, "ecc")
    for li, loc in enumerate(ECC_LOCATIONS):
        for ti, kind in enumerate(("corrected", "uncorrected")):
            for ci, counter in enumerate(("volatile", "aggregate")):
                set_val(g.ecc_location[li * 4 + ti * 2 + ci], ecc.get(f"{loc}_{kind}_{counter}"), "counter")
    histogram = _sub(_sub(p, "remapped_rows"), "histogram")
    for i, key in enumerate(REMAP_HISTOGRAM):
        _num(g.remap_histogram[i], histogram.get(key))
    fabric = _sub(p, "fabric")
    _num(g.fabric_state, fabric.get("state"))
    _num(g.fabric_status, fabric.get("status"))
    _num(g.fabric_clique, fabric.get("clique_id"))
    _num(g.fabric_health, fabric.get("health_mask"))


def _nvlink(g: Gpu, p: dict, slot: int) -> None:
    nv = p.get("nvlink") or {}
    mig_on = (p.get("mig") or {}).get("mode") == 1
    g.link_count = 0 if not nv or mig_on else min(int(nv["links"]), layout.MAX_LINKS)
    for i in range(g.link_count):
        link = g.links[i]
        set_val(link.state, 1)
        set_val(link.version, nv.get("version", 4))
        set_val(link.speed_mbps, nv.get("speed_mbps", 53125))
        # nvidia-smi -q and nvlink -s print no traffic or error counter: absent unless asked to synthesize
        counters = "nvlink_counters" in p.get("synthesize", SYNTHESIZABLE)
        set_val(link.tx_bytes, 0.0 if counters else None, "counter", amp=nv.get("tx_bytes_per_s", 0.0))
        set_val(link.rx_bytes, 0.0 if counters else None, "counter", amp=nv.get("rx_bytes_per_s", 0.0))
        for v in (link.crc_errors, link.replay_errors, link.recovery_errors, link.ecc_errors):
            set_val(v, 0.0 if counters else None, "counter")
        _str(link.remote_bus_id, f"00000000:{0xC0 + i // 4:02X}:{i % 4:02X}.0")  # NVSwitch ports


def _gpm(vals, gpm: dict | None) -> None:
    for name, i in GPM_SLOT.items():
        _num(vals[i], None if gpm is None else gpm.get(name, 0.0))


def _mig(g: Gpu, p: dict, slot: int) -> None:
    mig = p.get("mig")
    _num(g.mig_current, None if mig is None else mig.get("mode", 0))
    _num(g.mig_pending, None if mig is None else mig.get("pending", mig.get("mode", 0)))
    devices = (mig or {}).get("devices") or []
    if len(devices) > layout.MAX_MIG:
        raise ScenarioError(f"{len(devices)} MIG devices exceed the maximum of {layout.MAX_MIG}")
    g.mig_count = len(devices)
    uuid = g.uuid.s.decode(errors="replace")
    for i, d in enumerate(devices):
        m = g.migs[i]
        m.gi_id, m.ci_id = d["gi_id"], d.get("ci_id", 0)
        slices = mig_slices(d["profile"]) if d.get("profile") else 1
        share = re.match(r"(\d+)c\.", str(d.get("profile") or ""))  # "1c.3g.71gb": 1 of the 3 slices computes
        m.gi_slices, m.ci_slices = slices, int(share[1]) if share else slices
        m.gi_profile_id = d.get("gi_profile_id", {1: 0, 2: 5, 3: 2, 4: 3, 7: 4}.get(slices, 0))
        m.sm_count = d.get("sm_count") or MIG_SMS.get(slices, 16)
        # engine counts a capture does not print (None) take the profile's usual value: simulated
        m.ce_count, m.dec_count = _count(d, "ce_count", slices), _count(d, "dec_count", slices)
        m.enc_count, m.jpg_count = _count(d, "enc_count", 0), _count(d, "jpg_count", slices)
        m.ofa_count = _count(d, "ofa_count", 0)
        _str(m.profile, d.get("profile", f"{slices}g"))
        _str(m.uuid, f"MIG-{uuid[4:12]}-{i:04d}-{m.gi_id:04d}-{m.ci_id:04d}-{uuid[-12:]}")
        mem, bar1 = d.get("memory_mib") or {}, d.get("bar1_mib") or {}
        _num(m.mem_total, mem.get("total"), MIB)
        _num(m.mem_reserved, mem.get("reserved", 0), MIB)
        _num(m.mem_used, mem.get("used", 0), MIB)
        _num(m.bar1_total, bar1.get("total"), MIB)
        _num(m.bar1_used, bar1.get("used", 0), MIB)
        _gpm(m.gpm, p.get("gpm"))


def _count(d: dict, key: str, default: int) -> int:
    return default if d.get(key) is None else int(d[key])


def mig_slices(profile: str) -> int:
    """GPU slices of a MIG profile name: the N of its "Ng" part ("3g.40gb" and "1c.3g.71gb" -> 3; the
    "1c" of the second is its compute-instance share). Raises ValueError for a name without one."""
    m = re.search(r"(?:^|\.)(\d+)g(?:\.|$)", str(profile))
    if not m:
        raise ValueError(f"no 'Ng' slice count in MIG profile {profile!r}")
    return int(m[1])


def _processes(g: Gpu, procs: list[dict]) -> None:
    if len(procs) > layout.MAX_PROCS:
        raise ScenarioError(f"{len(procs)} processes exceed the maximum of {layout.MAX_PROCS} per GPU")
    g.proc_count = len(procs)
    for i, pr in enumerate(procs):
        if not isinstance(pr, dict) or "pid" not in pr:
            raise ScenarioError(f"a process needs at least a pid: {pr!r}")
        for key in ("pid", "used_mib", "sm_util", "mem_util", "gi_id", "ci_id"):
            if pr.get(key) is not None and (not isinstance(pr[key], (int, float)) or pr[key] < 0):
                raise ScenarioError(f"process {pr['pid']}: {key} must be a number >= 0, got {pr[key]!r}")
        slot = g.procs[i]
        kind = str(pr.get("type") or "C")  # C, G or C+G (nvidia-smi's Type); none given: a compute process
        slot.pid = int(pr["pid"])
        slot.kind = (1 if "C" in kind else 0) | (2 if "G" in kind else 0)
        slot.gi_id = NO_ID if pr.get("gi_id") is None else pr["gi_id"]
        slot.ci_id = NO_ID if pr.get("ci_id") is None else pr["ci_id"]
        # None (a capture's "Not available", as on WDDM): NVML's not-available value, never 0
        unknown = "used_mib" in pr and pr["used_mib"] is None
        slot.used_mem = NOT_AVAILABLE if unknown else int((pr.get("used_mib") or 0) * MIB)
        # sm_util None (never sampled by the capture's pmon): no utilization sample rather than 0
        sm = pr.get("sm_util", 0)
        slot.sm_util = NO_SAMPLE if sm is None else int(sm)
        slot.mem_util = int(pr.get("mem_util") or 0)
        _str(slot.name, str(pr.get("name", f"pid{slot.pid}")))


def apply_profile(st: SimState, slot: int, p: dict, node: str = "node") -> None:
    """Write one GPU profile (schema of gpuobs.sim.profiles) into a slot and make it present."""
    g = st.s.gpus[slot]
    ctypes.memset(ctypes.addressof(g), 0, ctypes.sizeof(Gpu))
    _identity(g, p, slot, node)
    _memory(g, p)
    _power_thermal_clocks(g, p)
    _pcie_ecc(g, p)
    _codec_ecc_fabric(g, p)
    _nvlink(g, p, slot)
    _num(g.gpm_supported, int(p.get("gpm") is not None))  # pre-Hopper: supported call, isSupportedDevice 0
    _gpm(g.gpm, p.get("gpm"))
    _mig(g, p, slot)
    _processes(g, p.get("processes") or [])
    for m in g.migs[: g.mig_count]:  # a MIG device's memory used covers its processes
        mine = sum(pr.used_mem for pr in g.procs[: g.proc_count]
                   if (pr.gi_id, pr.ci_id) == (m.gi_id, m.ci_id) and pr.used_mem != NOT_AVAILABLE)
        if not m.mem_used.ret and m.mem_used.base < mine:
            set_val(m.mem_used, float(mine))
    in_use = sum(pr.used_mem for pr in g.procs[: g.proc_count] if pr.used_mem != NOT_AVAILABLE)
    if in_use and not g.mem_used.ret and g.mem_used.base < in_use:  # and the GPU's covers all of them
        set_val(g.mem_used, float(in_use))
    g.supported_events = int(p.get("events", 0x8))
    for name in p.get("unsupported", []):
        st.unsupported(slot, name)
    g.present = 1


def behave(g: Gpu, p: dict, kind: str, period: float = 300.0) -> None:
    """Make a GPU's live values move: idle (flat), steady (busy with jitter), ramp (idle -> busy
    over `period` seconds) or noise (random between idle and busy, new every `period` seconds)."""
    if kind == "idle":
        return
    if kind not in ("steady", "ramp", "noise"):
        raise ScenarioError(f"unknown behaviour {kind!r}; use idle, steady, ramp or noise")
    power, clocks = _sub(p, "power_w"), _sub(p, "max_clocks_mhz")
    limit = power.get("enforced_limit") or power.get("limit") or 300.0
    busy = {  # (value, idle value) pairs; Val, busy, idle
        "util_gpu": (98.0, 0.0), "util_mem": (60.0, 0.0),
        "power_mw": (0.85 * limit * 1000, (power.get("draw") or 0.1 * limit) * 1000),
        # the 1 s average (what nvmlDeviceGetPowerUsage answers on Ampere and newer) follows the draw
        "power_avg_mw": (0.85 * limit * 1000, (power.get("average") or power.get("draw") or 0.1 * limit) * 1000),
        "temp_gpu": (68.0, float(_sub(p, "temperature_c").get("gpu") or 35)),
    }
    for attr, (hi, lo) in busy.items():
        v = getattr(g, attr)
        if v.ret:
            continue
        if kind == "steady":
            set_val(v, hi, "noise", amp=0.02 * hi, period=1.0)
        elif kind == "ramp":
            set_val(v, lo, "ramp", amp=hi - lo, period=period)
        else:
            set_val(v, (hi + lo) / 2, "noise", amp=(hi - lo) / 2, period=period)
    for i, name in enumerate(("graphics", "sm")):
        if not g.clock[i].ret and clocks.get(name):
            set_val(g.clock[i], clocks[name])
    if not g.pstate.ret:
        set_val(g.pstate, 0)
    if not g.clock_events.ret:
        set_val(g.clock_events, 0)  # busy: not idle
    if not g.power_mw.ret and not g.energy_mj.ret:
        set_counter(g.energy_mj, rate=g.power_mw.base)
    for name, value in (("sm_util", 85.0), ("sm_occupancy", 45.0), ("any_tensor_util", 60.0),
                        ("dram_bw_util", 55.0), ("fp16_util", 30.0), ("fp32_util", 10.0),
                        ("graphics_util", 98.0)):
        v = g.gpm[GPM_SLOT[name]]
        if not v.ret:
            set_val(v, value, "noise", amp=2.0, period=1.0)


def mig_layout(gpu_profile: dict, names: list[str]) -> dict:
    """MIG section for a layout such as ["3g.40gb", "2g.20gb"], sized from the GPU's memory."""
    total = _sub(gpu_profile, "memory_mib").get("total") or 81559
    free_ids = copy.deepcopy(GI_IDS)
    devices = []
    try:
        sizes = [mig_slices(name) for name in names]
    except ValueError:
        raise ScenarioError(f"MIG profiles look like '3g.40gb' or '1c.3g.71gb', got {names}") from None
    if sum(sizes) > 7:
        raise ScenarioError(f"MIG layout {names} does not fit: {sum(sizes)} of 7 compute slices")
    for name, slices in zip(names, sizes):
        if slices not in free_ids or not free_ids[slices]:
            raise ScenarioError(f"MIG profile {name!r} does not fit this layout")
        gb = re.search(r"\.(\d+)gb$", name)
        mib = MIG_MEMORY_MIB.get(int(gb[1]), int(gb[1]) * 1011) if gb else int(total * slices / 8)
        devices.append({"gi_id": free_ids[slices].pop(0), "ci_id": 0, "profile": name,
                        "memory_mib": {"total": mib, "used": 0, "reserved": 0},
                        "bar1_mib": {"total": 1024 * 32 * slices // 7, "used": 0}})
    return {"mode": 1, "pending": 1, "devices": devices}


# Simulator-only keys a capture cannot show, by architecture. "gpm": the GPU has GPM (Hopper and
# newer); its metric values are derived from the capture by _capture_gpm.
ARCH_EXTRAS: dict[str, dict[str, Any]] = {
    "Hopper": {"compute_capability": [9, 0], "gpm": {}},
    "Blackwell": {"compute_capability": [10, 0], "gpm": {}},
    "Ada Lovelace": {"compute_capability": [8, 9]},
    "Ampere": {"compute_capability": [8, 0]},
    "Turing": {"compute_capability": [7, 5]},
}


def _capture_profile(path: Path, phase: str) -> dict:
    """First GPU of a capture, completed with what -q does not show (NVLink from `nvlink -s`)."""
    from . import capture  # imported lazily: only capture-based scenarios need the parser

    text = path.read_text(errors="replace")
    found = capture.load_capture(path, phase)
    if not found:
        raise ScenarioError(f"no GPU in capture {path}")
    p = found[0]
    for key, value in ARCH_EXTRAS.get(p.get("architecture") or "", {}).items():
        p.setdefault(key, copy.deepcopy(value))
    p["gpm"] = _capture_gpm(p) if p.get("gpm") is not None else None
    speeds = [float(x) for x in re.findall(r"Link \d+: ([\d.]+) GB/s", text)]
    p.setdefault("nvlink", {"links": len(speeds), "version": 4, "speed_mbps": int(speeds[0] * 1000),
                            "tx_bytes_per_s": 0.0, "rx_bytes_per_s": 0.0} if speeds else None)
    return p


def _capture_gpm(p: dict) -> dict[str, float | None]:
    """GPM (profiling) metrics of a GPU seeded from a capture, which shows none of them: graphics
    engine activity is the capture's GPU utilization (both are the share of time a kernel ran),
    every other metric absent (NOT_SUPPORTED), never 0 under a load the capture shows."""
    util = _sub(p, "utilization_pct").get("gpu")
    return dict.fromkeys(GPM_SLOT) | {"graphics_util": None if util is None else float(util)}


def _deep_merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def _resolve(path: str, base: Path | None) -> Path:
    candidates = [base / path] if base else []
    candidates.append(Path(path))
    for c in candidates:
        if c.exists():
            return c
    raise ScenarioError(f"capture file {path!r} not found")


def expand(spec: dict, base: Path | None = None) -> tuple[dict, list[tuple[dict, str, float]]]:
    """Turn a scenario mapping into (driver info, [(profile, behaviour, period)] per GPU slot).

    Raises ScenarioError naming what is wrong: no 'gpus' list, an unknown driver or profile, a bad
    count, a process on a GPU that does not exist."""
    if not isinstance(spec, dict) or not isinstance(spec.get("gpus"), list):
        raise ScenarioError("a scenario needs a 'gpus' list")
    if not spec["gpus"]:
        raise ScenarioError("a scenario needs at least one GPU in 'gpus'")
    info, named = _driver_info(spec)
    slots: list[tuple[dict, str, float]] = []
    for n, entry in enumerate(spec["gpus"]):
        base_profile = _entry_profile(n, entry, base, spec, info, named)
        count = entry.get("count", 1)
        if not isinstance(count, int) or not 1 <= count <= layout.MAX_GPUS - len(slots):
            raise ScenarioError(f"gpus[{n}]: count must be an integer from 1 to {layout.MAX_GPUS} GPUs in all, "
                                f"got {count!r}")
        slots += [(copy.deepcopy(base_profile), entry.get("behaviour", "idle"), float(entry.get("period_s", 300)))
                  for _ in range(count)]
    _place_processes(spec, slots)
    _distinct_buses([p for p, _, _ in slots])
    return info, slots


def _distinct_buses(profiles: list[dict]) -> None:
    """Give each GPU slot its own PCI bus: a profile's own (a capture's) where still free, else the
    slot's generated one (BUSES), else the next free of BUSES; a moved GPU's bus id is re-derived."""
    used: set[int] = set()
    for slot, p in enumerate(profiles):
        if not isinstance(p.get("pci"), dict):
            p["pci"] = {}
        pci = p["pci"]
        bus = BUSES[slot] if pci.get("bus") is None else pci["bus"]
        if bus in used:
            bus = next(b for b in BUSES if b not in used)
            pci["bus"], pci["bus_id"] = bus, None
        used.add(bus)


def _driver_info(spec: dict) -> tuple[dict, bool]:
    """The scenario's driver, driver and CUDA versions; and whether the driver is a named release
    (builder.DRIVER_VERSIONS), whose versions win over a capture's."""
    driver = spec.get("driver", "current")
    try:
        builder.driver_symbols(driver)
    except ValueError as e:
        raise ScenarioError(f"driver: {e}") from None
    versions = builder.DRIVER_VERSIONS.get(driver)
    driver_version, cuda_version = versions or ("590.48.01", "13.1")
    return {"driver": driver, "driver_version": str(spec.get("driver_version", driver_version)),
            "cuda_version": str(spec.get("cuda_version", cuda_version))}, versions is not None


def _entry_profile(n: int, entry: object, base: Path | None, spec: dict, info: dict, named: bool) -> dict:
    """The profile of gpus[n]: from its capture (whose driver versions fill `info` unless the scenario or a
    named driver gives them) or named profile, with its overrides and MIG layout applied."""
    if not isinstance(entry, dict):
        raise ScenarioError(f"gpus[{n}] must be a mapping, got {entry!r}")
    if "capture" in entry:
        profile = _capture_profile(_resolve(entry["capture"], base), entry.get("phase", "load"))
        profile["synthesize"] = _synthesize(n, entry.get("synthesize"))
        for key in ("driver_version", "cuda_version"):
            if profile.get(key) and key not in spec and not named:
                info[key] = profile[key]
    elif "profile" in entry:
        try:
            profile = profiles.get(entry["profile"])
        except KeyError as e:
            raise ScenarioError(f"gpus[{n}]: {e.args[0]}") from None
    else:
        raise ScenarioError(f"gpus[{n}] needs 'profile' or 'capture'")
    _deep_merge(profile, entry.get("overrides") or {})
    if entry.get("mig"):
        profile["mig"] = mig_layout(profile, list(entry["mig"]))
    return profile


def _synthesize(n: int, asked: object) -> list[str]:
    """A capture entry's `synthesize` list (absent: nothing), checked against SYNTHESIZABLE."""
    names = [] if asked is None else [asked] if isinstance(asked, str) else asked
    if not isinstance(names, list) or any(name not in SYNTHESIZABLE for name in names):
        raise ScenarioError(f"gpus[{n}]: synthesize takes a list of {', '.join(SYNTHESIZABLE)}, got {asked!r}")
    return list(names)


def _place_processes(spec: dict, slots: list[tuple[dict, str, float]]) -> None:
    """Add the scenario's 'processes' to the profiles of the GPUs they name."""
    procs = spec.get("processes") or []
    if not isinstance(procs, list):
        raise ScenarioError("'processes' must be a list")
    for pr in procs:
        gpu = int(pr.get("gpu", 0))
        if not 0 <= gpu < len(slots):
            raise ScenarioError(f"process {pr.get('pid')} names GPU {gpu}, which does not exist")
        slots[gpu][0].setdefault("processes", []).append(pr)


def apply(st: SimState, spec: dict, base: Path | None = None, node: str = "node") -> None:
    """Write a whole scenario (a parsed YAML mapping) into a state file.

    Raises ScenarioError for any scenario it cannot apply, naming what is wrong.
    """
    try:
        _apply(st, spec, base, node)
    except ScenarioError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OSError) as e:
        raise ScenarioError(f"invalid scenario: {type(e).__name__}: {e}") from None


def _apply(st: SimState, spec: dict, base: Path | None, node: str) -> None:
    info, slots = expand(spec, base)
    _str(st.s.driver_version, info["driver_version"])
    cuda = re.match(r"\s*(\d+)(?:\.(\d+))?", info["cuda_version"])
    if not cuda:
        raise ScenarioError(f"cuda_version must look like '13.1', got {info['cuda_version']!r}")
    major, minor = int(cuda[1]), int(cuda[2] or 0)
    st.s.cuda_version = major * 1000 + minor * 10
    _str(st.s.nvml_version, f"{major}.{info['driver_version']}")  # e.g. 11.470.256.02, as NVML reports
    st.s.gpu_slots = len(slots)
    for slot, (p, behaviour, period) in enumerate(slots):
        apply_profile(st, slot, p, node)
        behave(st.s.gpus[slot], p, behaviour, period)
    try:
        topology.apply(st, spec.get("topology"), len(slots))
    except topology.TopologyError as e:
        raise ScenarioError(str(e)) from None


def load(path: str | Path) -> dict:
    """Parse a scenario YAML file; ScenarioError on a missing file or bad YAML. A file that is an
    `nvidia-smi` capture (its `# <phase> :: query (-q)` banners) is taken as the scenario
    `{gpus: [{capture: FILE, phase: load}]}`."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
        if re.search(r"^# (idle|load) :: query \(-q\)", text, re.M):
            return {"gpus": [{"capture": str(path.resolve()), "phase": "load"}]}
        spec = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"cannot read scenario {path}: {e}") from None
    if not isinstance(spec, dict):
        raise ScenarioError(f"{path}: a scenario needs a 'gpus' list (a YAML mapping)")
    return spec
