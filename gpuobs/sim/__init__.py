"""The NVML simulator: a C library that pynvml loads as libnvidia-ml.so.1, driven from Python.

Typical use in one process::

    with Simulator.from_file("examples/scenarios/8xh100.yaml") as sim:
        pynvml.nvmlInit()                 # answers from the simulated node
        sim.state.xid(0, 79)              # live changes are seen by the next NVML call

and for another program, `sim.env()` gives the environment that makes it load the simulator.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

from . import scenario
from .builder import BuildError, build
from .state import SimState

__all__ = ["BuildError", "SimState", "Simulator", "build", "preload"]

_preloaded: Path | None = None


def preload() -> Path:
    """Build and load the simulator into this process, before pynvml loads its library.

    The dynamic loader matches later dlopen("libnvidia-ml.so.1") calls (pynvml's) by SONAME
    to the already loaded simulator. Raises RuntimeError if a different NVML is already loaded.
    """
    global _preloaded
    lib = build()
    if _preloaded is None:
        import pynvml

        if pynvml.nvmlLib is not None:
            try:  # succeeds only if this very file is what pynvml loaded (e.g. via LD_LIBRARY_PATH)
                ctypes.CDLL(str(lib), mode=os.RTLD_NOLOAD)
            except OSError:
                raise RuntimeError("pynvml already loaded another libnvidia-ml.so.1 in this process") from None
        handle = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        if pynvml.nvmlLib is None:
            pynvml.nvmlLib = handle
        _preloaded = lib
    return lib


class Simulator:
    """A simulated node: a state file seeded from a scenario, usable in-process or by children.

    The state file lives in `directory` (a new temporary folder by default, removed on close).
    """

    def __init__(self, spec: dict, base: Path | None = None, directory: str | os.PathLike | None = None,
                 node: str = "node"):
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="gpuobs-sim-")
        folder = Path(directory or self._tmp.name)
        folder.mkdir(parents=True, exist_ok=True)
        self.library = build()
        self.state = SimState.create(folder / "state.bin")
        try:
            scenario.apply(self.state, spec, base, node)
        except Exception:
            self.close()
            raise

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kw) -> "Simulator":
        """A simulator seeded from a scenario YAML file."""
        return cls(scenario.load(path), base=Path(path).resolve().parent, **kw)

    @property
    def state_path(self) -> Path:
        """Path of the shared state file (what $GPUOBS_SIM_STATE names)."""
        return self.state.path

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a child process: loads the simulator and reads this node's state."""
        env = dict(os.environ if base is None else base)
        libdir = str(self.library.parent)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
        env["GPUOBS_SIM_STATE"] = str(self.state_path)
        return env

    def activate(self) -> "Simulator":
        """Make this process's pynvml answer from this node (takes effect at the next nvmlInit)."""
        preload()
        os.environ["GPUOBS_SIM_STATE"] = str(self.state_path)
        return self

    def close(self) -> None:
        """Unmap the state and remove a temporary state folder."""
        self.state.close()
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self) -> "Simulator":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.close()
