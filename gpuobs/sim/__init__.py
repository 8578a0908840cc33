"""The NVML simulator: a C library that pynvml loads as libnvidia-ml.so.1, driven from Python.

Typical use in one process::

    with Simulator.from_file("examples/scenarios/8xh100.yaml") as sim:
        pynvml.nvmlInit()                 # answers from the simulated node
        sim.state.xid(0, 79)              # live changes are seen by the next NVML call

and for another program, `sim.env()` gives the environment that makes it load the simulator.

An older driver, for child processes: `Simulator(spec, driver="r470")` (or `driver: r470` in the
scenario) makes `env()` point at a library built without the symbols that driver lacks
(`builder.DRIVERS`), so pynvml raises FUNCTION_NOT_FOUND for them there. This process keeps the
full library (one libnvidia-ml.so.1 per process); `binding.hidden_symbols(...)` emulates the
missing symbols in-process instead.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

from . import builder, scenario
from .builder import DRIVERS, BuildError, build
from .state import SimState

__all__ = ["DRIVERS", "BuildError", "SimState", "Simulator", "build", "preload"]

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
    driver: a name in builder.DRIVERS (default: the scenario's `driver` key, else "current"): child
    processes started with env() load a library without the symbols that driver lacks, and the
    node reports that driver's version strings unless the scenario sets its own. `library` is the
    full library (what activate() loads into this process), `child_library` the one env() names.
    """

    def __init__(self, spec: dict, base: Path | None = None, directory: str | os.PathLike | None = None,
                 node: str = "node", driver: str | None = None):
        if driver is not None and isinstance(spec, dict):
            spec = {**spec, "driver": driver}
        self.driver = spec.get("driver", "current") if isinstance(spec, dict) else "current"
        try:
            self.hidden = builder.driver_symbols(self.driver)
        except ValueError as e:
            raise scenario.ScenarioError(f"driver: {e}") from None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory:
            folder = Path(directory)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="gpuobs-sim-")
            folder = Path(self._tmp.name)
        folder.mkdir(parents=True, exist_ok=True)
        self.library = build()
        self.child_library = build(hide=self.hidden) if self.hidden else self.library
        self.state = SimState.create(folder / "state.bin")
        try:
            scenario.apply(self.state, spec, base, node)
        except Exception:
            self.close()
            raise

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kw) -> "Simulator":
        """A simulator seeded from a scenario YAML file."""
        return cls(scenario.load(Path(path)), base=Path(path).resolve().parent, **kw)

    @property
    def state_path(self) -> Path:
        """Path of the shared state file (what $GPUOBS_SIM_STATE names)."""
        return self.state.path

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a child process: loads the simulator (the driver's variant) and reads this
        node's state."""
        env = dict(os.environ if base is None else base)
        libdir = str(self.child_library.parent)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
        env["GPUOBS_SIM_STATE"] = str(self.state_path)
        return env

    def activate(self) -> "Simulator":
        """Make this process's pynvml answer from this node (takes effect at the next nvmlInit).

        Always the full library, whatever `driver` says: see binding.hidden_symbols for in-process
        emulation of an older driver's missing symbols."""
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
