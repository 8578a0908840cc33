"""One rank of a small real PyTorch training job instrumented with gpuobs, for the live alert tests.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (DDP over gloo when
WORLD_SIZE > 1), GPUOBS_JOB_ID and GPUOBS_PROMETHEUS_PORT set. The model is two Linear layers around
an op whose forward and backward take a set time (a stand-in for device kernels: on a GPU the
host waits for a slow device the same way), so each rank's compute time is known and the 2-core
test machine's contention does not blur it. Faults are chosen by arguments: a slow rank, a
slowdown after some seconds, a slow loader (every rank's, or one rank's), rare slow batches,
training that stops while the process lives on, a rank that exits, a rank that hangs so that its
peers hit the process group's real timeout (with --uncaught the RuntimeError escapes, as in a job
without an elastic agent, and gpuobs.logs counts its text), and collectives that slow down.

Slow collectives (--coll-kib, --coll-slow-after, --coll-grow): every step also all-reduces a
buffer of coll-kib KiB by hand (as FSDP, or a model's own gradient sync, would), timed with
run.collective(). After coll-slow-after seconds the buffer grows coll-grow times, the same on
every rank, so the real gloo all-reduce moves that many more bytes and takes longer, while the
compute (the timed sleeps) stays what it was: from the job's side that is what a slower network,
or a collective algorithm that got worse, looks like. A sleep inside run.collective() would be
counted the same way, but would test only the arithmetic; the bytes make the wait real. On
loopback gloo reduces about 1.5 GB/s, so 2 MiB take ~3 ms and 48 MiB (24x) ~35 ms: the collective
share of a ~100 ms step rises from a few % to over 25 %, at a CPU cost of about a quarter of a
core per rank (on loopback the transfer is CPU work).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from device_time import DeviceTime  # beside this script: its directory is on sys.path

from gpuobs import instrument, logs
from gpuobs.instrument.timing import WallTimer


class Model(torch.nn.Module):
    def __init__(self, job: "Job"):
        super().__init__()
        self.job = job
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)

    def forward(self, x):
        f = self.job.factor()
        return self.b(DeviceTime.apply(self.a(x), self.job.fwd_s * f, self.job.bwd_s * f))


class Job:
    def __init__(self, args, rank: int):
        self.args, self.rank, self.t0 = args, rank, time.monotonic()
        self.fwd_s, self.bwd_s = args.fwd_ms / 1000, args.bwd_ms / 1000
        self._buffer: torch.Tensor | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def factor(self) -> float:
        if self.rank == self.args.hang_rank and self.elapsed() >= self.args.hang_after:
            print(f"rank {self.rank}: hangs (stops entering collectives)", flush=True)
            while True:  # a hung rank: its process lives, its peers wait for it in their collectives
                time.sleep(3600)
        f = self.args.slow_factor if self.rank == self.args.slow_rank else 1.0
        if self.args.slow_after is not None and self.elapsed() >= self.args.slow_after:
            f *= self.args.later_factor
        return f

    def coll_grown(self) -> bool:
        """Whether the hand-reduced buffer has grown by this rank's clock (rank 0's decides: train())."""
        return self.args.coll_slow_after is not None and self.elapsed() >= self.args.coll_slow_after

    def coll_buffer(self, grown: bool) -> torch.Tensor:
        """The hand-reduced buffer: coll-kib KiB of float32, coll-grow times that once grown."""
        n = int(self.args.coll_kib * 256 * (self.args.coll_grow if grown else 1))
        if self._buffer is None or self._buffer.numel() != n:
            self._buffer = torch.ones(n)
        return self._buffer

    def batches(self):
        n = 0
        while True:
            n += 1
            wait = self.args.data_slow_ms if self.rank == self.args.data_slow_rank else self.args.data_ms
            if self.args.burst_every and n % self.args.burst_every == 0:
                wait = self.args.burst_ms
            time.sleep(wait / 1000)
            yield torch.randn(8, 32), torch.randn(8, 1)


def train(args, job: Job, run, model, opt, rank: int, world: int) -> None:
    for x, y in run.data(job.batches()):
        if rank == args.die_rank and args.die_after is not None and job.elapsed() >= args.die_after:
            os._exit(3)  # a crash: no clean shutdown, no last export
        stop = job.elapsed() >= args.seconds or (args.stop_after is not None and job.elapsed() >= args.stop_after)
        grown = job.coll_grown()
        if world > 1:  # rank 0's clock decides for all: no rank leaves a collective half done, and all
            flags = torch.tensor([float(stop), float(grown)])  # reduce buffers of one size (gloo checks)
            dist.broadcast(flags, 0)
            stop, grown = bool(flags[0].item()), bool(flags[1].item())
        if stop:
            return
        with run.step(samples=len(x)):
            with run.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            if args.coll_kib:
                with run.collective("extra_all_reduce"):  # real bytes through gloo (module docstring)
                    dist.all_reduce(job.coll_buffer(grown))
        run.report(loss=loss)


def parse_args() -> argparse.Namespace:
    """The job's options (times in ms or s as named; ranks by RANK)."""
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--fwd-ms", type=float, default=30)
    p.add_argument("--bwd-ms", type=float, default=60)
    p.add_argument("--data-ms", type=float, default=2)
    p.add_argument("--data-slow-rank", type=int, default=-1, help="this rank's loader waits data-slow-ms")
    p.add_argument("--data-slow-ms", type=float, default=30)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.3)
    p.add_argument("--slow-after", type=float, default=None, help="seconds; then every rank is later-factor slower")
    p.add_argument("--later-factor", type=float, default=1.5)
    p.add_argument("--burst-every", type=int, default=0, help="every Nth batch waits burst-ms")
    p.add_argument("--burst-ms", type=float, default=500)
    p.add_argument("--stop-after", type=float, default=None, help="stop training, keep serving metrics")
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-after", type=float, default=None)
    p.add_argument("--hang-rank", type=int, default=-1, help="this rank hangs in a step after hang-after s")
    p.add_argument("--hang-after", type=float, default=0)
    p.add_argument("--pg-timeout-s", type=float, default=None, help="the process group's collective timeout")
    p.add_argument("--uncaught", action="store_true",
                   help="a collective's RuntimeError ends the process (logged through gpuobs.logs)")
    p.add_argument("--coll-kib", type=float, default=0, help="hand-written all-reduce per step (0: none)")
    p.add_argument("--coll-slow-after", type=float, default=None, help="seconds; then the buffer grows")
    p.add_argument("--coll-grow", type=float, default=16)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.uncaught:  # the uncaught error is logged, its pattern counted and served in the exit grace
        logs.configure(stream=sys.stderr)
    instrument.configure()
    job = Job(args, rank)
    model: torch.nn.Module = Model(job)
    run = instrument.TrainingRun(timer=WallTimer())
    if world > 1:
        timeout = {} if args.pg_timeout_s is None else {"timeout": timedelta(seconds=args.pg_timeout_s)}
        dist.init_process_group("gloo", rank=rank, world_size=world, **timeout)
        model = torch.nn.parallel.DistributedDataParallel(model)
        assert run.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        train(args, job, run, model, opt, rank, world)
    except RuntimeError as e:  # a peer died mid-collective: this rank stays up, as under an elastic agent
        if args.uncaught:
            raise
        print(f"rank {rank}: training stopped: {str(e)[:200]}", flush=True)
    while job.elapsed() < args.seconds:  # training stopped; the process (and its endpoint) lives on
        time.sleep(0.2)
    run.close()


if __name__ == "__main__":
    main()
