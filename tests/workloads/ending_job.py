"""A training process that ends the way its argument says, for tests/test_instrument_ending.py.

Serves its metrics on GPUOBS_PROMETHEUS_PORT (GPUOBS_EXIT_GRACE_S as the test sets it), logs through
gpuobs.logs (so an uncaught exception is counted by pattern), trains two steps, prints "ready" and
waits for a line on stdin; then `crash` raises the RuntimeError a gloo collective raises on timeout,
`oom` the text of a CUDA OOM, `end` returns normally."""

from __future__ import annotations

import sys

from gpuobs import instrument, logs

logs.configure(stream=sys.stderr)
instrument.configure(prometheus_addr="127.0.0.1", spans=False)
run = instrument.TrainingRun()
for _ in range(2):
    with run.step(samples=4):
        pass
print("ready", flush=True)
sys.stdin.readline()
if sys.argv[1] == "crash":
    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 3000ms for recv "
                       "operation to complete")
if sys.argv[1] == "oom":
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
print("done", flush=True)
