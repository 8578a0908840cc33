"""One rank of a small real PyTorch training job instrumented with gpuobs, for the live alert tests.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (DDP over gloo when
WORLD_SIZE > 1), GPUOBS_JOB_ID and GPUOBS_PROMETHEUS_PORT set. The model is two Linear layers around
an op whose forward and backward take a set time (a stand-in for device kernels: on a GPU the
host waits for a slow device the same way), so each rank's compute time is known and the 2-core
test machine's contention does not blur it. Faults are chosen by arguments: a slow rank, a
slowdown after some seconds, a slow loader, rare slow batches, training that stops while the
process lives on, a rank that exits.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from gpuobs import instrument
from gpuobs.instrument.timing import WallTimer


class DeviceTime(torch.autograd.Function):
    """Identity whose forward and backward take fwd_s and bwd_s seconds."""

    @staticmethod
    def forward(ctx, x, fwd_s: float, bwd_s: float):
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_s)
        return grad, None, None


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

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def factor(self) -> float:
        f = self.args.slow_factor if self.rank == self.args.slow_rank else 1.0
        if self.args.slow_after is not None and self.elapsed() >= self.args.slow_after:
            f *= self.args.later_factor
        return f

    def batches(self):
        n = 0
        while True:
            n += 1
            wait = self.args.data_ms
            if self.args.burst_every and n % self.args.burst_every == 0:
                wait = self.args.burst_ms
            time.sleep(wait / 1000)
            yield torch.randn(8, 32), torch.randn(8, 1)


def train(args, job: Job, run, model, opt, rank: int, world: int) -> None:
    for x, y in run.data(job.batches()):
        if rank == args.die_rank and args.die_after is not None and job.elapsed() >= args.die_after:
            os._exit(3)  # a crash: no clean shutdown, no last export
        stop = job.elapsed() >= args.seconds or (args.stop_after is not None and job.elapsed() >= args.stop_after)
        if world > 1:  # rank 0's clock decides for all, so no rank leaves a collective half done
            flag = torch.tensor([float(stop)])
            dist.broadcast(flag, 0)
            stop = bool(flag.item())
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
        run.report(loss=loss)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--fwd-ms", type=float, default=30)
    p.add_argument("--bwd-ms", type=float, default=60)
    p.add_argument("--data-ms", type=float, default=2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.3)
    p.add_argument("--slow-after", type=float, default=None, help="seconds; then every rank is later-factor slower")
    p.add_argument("--later-factor", type=float, default=1.5)
    p.add_argument("--burst-every", type=int, default=0, help="every Nth batch waits burst-ms")
    p.add_argument("--burst-ms", type=float, default=500)
    p.add_argument("--stop-after", type=float, default=None, help="stop training, keep serving metrics")
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-after", type=float, default=None)
    args = p.parse_args()

    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    instrument.configure()
    job = Job(args, rank)
    model: torch.nn.Module = Model(job)
    run = instrument.TrainingRun(timer=WallTimer())
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
        assert run.watch_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        train(args, job, run, model, opt, rank, world)
    except RuntimeError as e:  # a peer died mid-collective: this rank stays up, as under an elastic agent
        print(f"rank {rank}: training stopped: {str(e)[:200]}", flush=True)
    while job.elapsed() < args.seconds:  # training stopped; the process (and its endpoint) lives on
        time.sleep(0.2)
    run.close()


if __name__ == "__main__":
    main()
