"""The real old pynvml release (11.4.1, January 2021) for child processes under test.

It returns `bytes` from every string call and struct field, wants `bytes` arguments, calls
nvmlDeviceGetComputeRunningProcesses_v2 / nvmlDeviceGetMemoryInfo (v1), and lacks every constant
and function added since (GPM, nvmlMemory_v2, ...). Use:

    env = sim.env()
    env["PYTHONPATH"] = os.pathsep.join([str(legacy_pynvml_path()), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", "import pynvml; ..."], env=env)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuobs.sim.builder import cache_root

VERSION = "11.4.1"


def _installed(target: Path) -> bool:
    return (target / "pynvml" / "nvml.py").is_file() and (target / f"pynvml-{VERSION}.dist-info").is_dir()


def legacy_pynvml_path() -> Path:
    """The folder to put first on a child's PYTHONPATH so that `import pynvml` loads 11.4.1.

    Installed once with `pip install --no-deps --target` into cache_root()/pynvml-11.4.1 and reused;
    skips the calling test (with pip's error) when it cannot be installed, e.g. offline.
    """
    target = cache_root() / f"pynvml-{VERSION}"
    if _installed(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".pynvml-{VERSION}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; it becomes the shared cache folder
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                               "--disable-pip-version-check", "--no-input", "--target", str(staging),
                               f"pynvml=={VERSION}"], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not _installed(staging):
            pytest.skip(f"cannot install pynvml=={VERSION}: {(proc.stderr or proc.stdout).strip()[-2000:]}")
        try:
            os.rename(staging, target)  # atomic; a concurrent installer that got there first wins
        except OSError:
            if not _installed(target):  # a broken leftover, not a finished install: replace it
                shutil.rmtree(target, ignore_errors=True)
                os.rename(staging, target)
    except subprocess.TimeoutExpired as e:
        pytest.skip(f"cannot install pynvml=={VERSION}: pip timed out: {e}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
