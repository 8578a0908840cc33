"""Build the simulator library from its C source with the system C compiler, cached by content.

`build(hide=names)` builds the same library with some NVML symbols left out of its dynamic symbol
table, so that dlsym (what pynvml's `_nvmlGetFunctionPointer` does) fails for them exactly as on a
driver that predates them: pynvml raises NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND). `DRIVERS` names
such symbol sets for real driver branches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from . import layout

SOURCE = Path(__file__).with_name("nvml_sim.c")
LIB_NAME = "libnvidia-ml.so.1"  # the SONAME pynvml asks the dynamic loader for
CFLAGS = ["-O2", "-std=gnu11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
          "-Werror", "-Wno-unused-parameter", f"-Wl,-soname,{LIB_NAME}"]


class BuildError(RuntimeError):
    """The C compiler is missing or rejected the simulator source."""


def cache_root() -> Path:
    """Where built libraries live: $GPUOBS_CACHE_DIR, else $XDG_CACHE_HOME/gpuobs, else ~/.cache/gpuobs."""
    env = os.environ.get("GPUOBS_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuobs"


def implemented_functions() -> list[str]:
    """Names of the NVML functions the C source implements, in function-id order."""
    return layout.func_names(SOURCE.read_text())


# ---- driver generations ------------------------------------------------------------------------
#
# Which of the simulator's functions each driver branch's libnvidia-ml.so.1 lacks. Derived from
# nvml.h as NVIDIA ships it with each driver release in github.com/NVIDIA/nvidia-settings (src/nvml.h,
# one git tag per release, 418.30 to 610.43.03): a function counts as exported by a release when its
# header declares it, directly, in the legacy NVML_NO_UNVERSIONED_FUNC_DEFS block, or as the target
# of a versioning #define. First releases that have each (all others predate R470):
#   nvmlDeviceGetMemoryInfo_v2, nvmlDevice{Compute,Graphics,MPSCompute}RunningProcesses_v3,
#     nvmlDeviceGetNumGpuCores, nvmlDeviceGetNumFans ............................... 510.39.01
#   nvmlGpmQueryDeviceSupport, nvmlGpmSample{Alloc,Free,Get}, nvmlGpmMetricsGet ..... 520.56.06
#   nvmlGpmMigSampleGet, nvmlDeviceGetGpuMaxPcieLinkGeneration,
#     nvmlDeviceGetGpuFabricInfo ................................................... 525.53
#   nvmlDevice{Current,Supported}ClocksEventReasons (older: ...ClocksThrottleReasons)  535.43.02
#   nvmlGpmQueryIfStreamingEnabled ................................................. 535.54.03
#   nvmlDeviceGetPciInfoExt, nvmlDeviceGetGpuFabricInfoV ........................... 550.40.07
#   nvmlDeviceGetTemperatureV ...................................................... 565.57.01
#   nvmlDeviceGetMarginTemperature ................................................. 570.86.16
# nvmlDeviceGetRowRemapperHistogram (450.51), nvmlDeviceGetEncoderStats (375.66), nvmlDeviceGetFBCStats
# (410.104) and nvmlDeviceGetMemoryErrorCounter (375.26) predate R470: every listed generation has them.
# 535.98 alone dropped the three ..._v3 process calls again (back in 535.104.05; see also
# XuehaiPan/nvitop#88 and #89, where pynvml raised FunctionNotFound on that driver). Calls older
# drivers still have for fallback: nvmlDeviceGetMemoryInfo (v1), ...ClocksThrottleReasons, the
# process calls _v2 (R450+; MPS: R470+) and unsuffixed v1, nvmlEventSetWait (v1 struct; _v2 is R450+),
# nvmlDeviceGetPciInfo_v3.
_R510 = ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v3",
         "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
         "nvmlDeviceGetNumGpuCores", "nvmlDeviceGetNumFans")
_R520 = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
         "nvmlGpmMetricsGet")
_R525 = ("nvmlGpmMigSampleGet", "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetGpuFabricInfo")
_R535 = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetSupportedClocksEventReasons",
         "nvmlGpmQueryIfStreamingEnabled")
_R550 = ("nvmlDeviceGetPciInfoExt", "nvmlDeviceGetGpuFabricInfoV")
_R570 = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetMarginTemperature")  # TemperatureV: 565

# name -> the simulator functions that driver branch does not export.
DRIVERS: dict[str, tuple[str, ...]] = {
    "r470": _R510 + _R520 + _R525 + _R535 + _R550 + _R570,
    "r510": _R520 + _R525 + _R535 + _R550 + _R570,
    "r525": _R535 + _R550 + _R570,
    "r535": _R550 + _R570,
    "r535.98": _R510[1:4] + _R550 + _R570,
    "r550": _R570,
    "current": (),
}
# name -> (driver version, CUDA version) a scenario reports for it unless it sets its own: the last
# release of each branch (nvidia-settings tags) and the CUDA version that branch shipped with.
DRIVER_VERSIONS: dict[str, tuple[str, str]] = {
    "r470": ("470.256.02", "11.4"), "r510": ("510.108.03", "11.6"), "r525": ("525.147.05", "12.0"),
    "r535": ("535.309.01", "12.2"), "r535.98": ("535.98", "12.2"), "r550": ("550.144.03", "12.4"),
}


def driver_symbols(driver: str) -> tuple[str, ...]:
    """The functions a named driver generation lacks; ValueError names the known generations."""
    try:
        return DRIVERS[driver]
    except (KeyError, TypeError):
        raise ValueError(f"unknown driver {driver!r}; known: {', '.join(DRIVERS)}") from None


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BuildError("no C compiler found: install gcc (Debian: apt-get install gcc) or set CC")
    return cc


def build(force: bool = False, hide: Iterable[str] = ()) -> Path:
    """Compile the library if its source, header, flags or hidden symbols changed; return its path.

    The output directory is named by a hash of everything that goes into the build, so a
    change to nvml_sim.c or layout.py yields a new library and an unchanged one is reused.
    hide: NVML function names to leave out of the exported symbols (an older driver, see DRIVERS):
    the library is otherwise the same (same function ids, same state layout), built into a folder
    of its own. Raises ValueError for a name the simulator does not implement, BuildError with the
    compiler's output when compilation fails.
    """
    source = SOURCE.read_text()
    names = layout.func_names(source)
    hidden = sorted(set(hide))
    unknown = [n for n in hidden if n not in names]
    if unknown:
        raise ValueError(f"cannot hide {', '.join(unknown)}: the simulator does not implement "
                         f"{'it' if len(unknown) == 1 else 'them'}")
    header = layout.c_header(names, layout.field_ids(source))
    cc = _compiler()
    parts = [source, header, cc, *CFLAGS] + (["hide:", *hidden] if hidden else [])
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    out_dir = cache_root() / "sim" / digest
    lib = out_dir / LIB_NAME
    if lib.exists() and not force:
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        (Path(tmp) / "sim_state.h").write_text(header)
        tmp_lib = Path(tmp) / LIB_NAME
        flags = list(CFLAGS)
        if hidden:
            # An anonymous GNU ld version script: exact names take precedence over the wildcard,
            # so these become local (absent from .dynsym) and every other exported name stays.
            script = Path(tmp) / "hide.map"
            script.write_text("{\n  global: *;\n  local:\n" + "".join(f"    {n};\n" for n in hidden) + "};\n")
            flags.append(f"-Wl,--version-script={script}")
        cmd = [cc, *flags, "-I", tmp, "-o", str(tmp_lib), str(SOURCE), "-lm", "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"compiling {SOURCE.name} failed:\n{proc.stderr}")
        shutil.copy(Path(tmp) / "sim_state.h", out_dir / "sim_state.h")
        if hidden:
            (out_dir / "hidden.txt").write_text("".join(f"{n}\n" for n in hidden))
        os.replace(tmp_lib, lib)  # atomic: concurrent builders never see a half-written library
    return lib
