"""Build the simulator library from its C source with the system C compiler, cached by content."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
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


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BuildError("no C compiler found: install gcc (Debian: apt-get install gcc) or set CC")
    return cc


def build(force: bool = False) -> Path:
    """Compile the library if its source, header or flags changed; return its path.

    The output directory is named by a hash of everything that goes into the build, so a
    change to nvml_sim.c or layout.py yields a new library and an unchanged one is reused.
    Raises BuildError with the compiler's output when compilation fails.
    """
    source = SOURCE.read_text()
    header = layout.c_header(layout.func_names(source))
    cc = _compiler()
    digest = hashlib.sha256("\0".join([source, header, cc, *CFLAGS]).encode()).hexdigest()[:16]
    out_dir = cache_root() / "sim" / digest
    lib = out_dir / LIB_NAME
    if lib.exists() and not force:
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        (Path(tmp) / "sim_state.h").write_text(header)
        tmp_lib = Path(tmp) / LIB_NAME
        cmd = [cc, *CFLAGS, "-I", tmp, "-o", str(tmp_lib), str(SOURCE), "-lm", "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"compiling {SOURCE.name} failed:\n{proc.stderr}")
        shutil.copy(Path(tmp) / "sim_state.h", out_dir / "sim_state.h")
        os.replace(tmp_lib, lib)  # atomic: concurrent builders never see a half-written library
    return lib
