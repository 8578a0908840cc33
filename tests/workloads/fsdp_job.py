"""One rank of a small real FSDP2 training job (torch.distributed.fsdp.fully_shard over gloo),
instrumented with gpuobs and nothing else around its collectives: `run.watch(model)` times FSDP's
all-gathers and reduce-scatters.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT, GPUOBS_JOB_ID and (to be
scraped) GPUOBS_PROMETHEUS_PORT set; the arguments follow tests/workloads/ddp_job.py (--seconds,
--slow-rank, --slow-factor, ...). Each Linear layer is its own FSDP module and the op whose forward
and backward take a set time (a stand-in for device kernels) sits between them, inside the sharded
model, so each rank's compute time is known. --no-watch leaves the collectives untimed (the
blindness run.watch fixes); --user-comm gives the first layer a user's own all-gather (watch must
keep it); --report PATH writes this rank's compute and collective seconds, steps, comm calls and
the gpuobs warnings logged, as JSON, read from an in-process metric reader after the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import torch
import torch.distributed as dist
from device_time import DeviceTime  # beside this script: its directory is on sys.path
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

from gpuobs import catalog as c
from gpuobs import instrument
from gpuobs.instrument.timing import WallTimer


class Model(torch.nn.Module):
    def __init__(self, fwd_s: float, bwd_s: float):
        super().__init__()
        self.fwd_s, self.bwd_s = fwd_s, bwd_s
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.b(DeviceTime.apply(self.a(x), self.fwd_s, self.bwd_s))


class UserAllGather(DefaultAllGather):
    """A user's own all-gather comm (FSDP's default, counting its calls): watch must keep it."""
    calls = 0

    def __call__(self, *args, **kwargs):
        UserAllGather.calls += 1
        return super().__call__(*args, **kwargs)


class Warnings(logging.Handler):
    """Keeps the gpuobs warnings' messages (the report says whether the untimed warning came)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def train(args, run, model, opt) -> int:
    """Steps until rank 0's clock passes --seconds (broadcast, so no rank leaves a collective half
    done); returns the steps taken."""
    t0, steps = time.monotonic(), 0
    while True:
        flag = torch.tensor([float(time.monotonic() - t0 >= args.seconds)])
        dist.broadcast(flag, 0)
        if flag.item():
            return steps
        time.sleep(args.data_ms / 1000)
        x, y = torch.randn(8, 32), torch.randn(8, 1)
        with run.step(samples=len(x)):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        run.report(loss=loss)
        steps += 1


def totals(reader: InMemoryMetricReader) -> dict[str, float]:
    """This process's compute seconds, collective seconds and steps (one run: sums of the points)."""
    data = reader.get_metrics_data()
    points = {m.name: m.data.data_points for rm in (data.resource_metrics if data else ())
              for sm in rm.scope_metrics for m in sm.metrics}
    return {key: sum(p.value for p in points.get(metric.otel_name, ()))
            for key, metric in (("compute", c.COMPUTE), ("collective", c.COLLECTIVE_WAIT), ("steps", c.STEPS))}


def comm(module) -> object:
    """The module's all-gather comm now (FSDP's private attribute, which gpuobs.instrument.fsdp reads)."""
    return module._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--fwd-ms", type=float, default=30)
    p.add_argument("--bwd-ms", type=float, default=60)
    p.add_argument("--data-ms", type=float, default=2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.3)
    p.add_argument("--no-watch", action="store_true", help="leave the collectives untimed")
    p.add_argument("--user-comm", action="store_true", help="the first layer has the user's own all-gather")
    p.add_argument("--report", default=None, help="write this rank's totals as JSON here")
    args = p.parse_args()

    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    warned = Warnings()
    logging.getLogger("gpuobs.instrument").addHandler(warned)
    reader = InMemoryMetricReader()
    instrument.configure(metric_readers=[reader])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    f = args.slow_factor if rank == args.slow_rank else 1.0
    model = Model(args.fwd_ms / 1000 * f, args.bwd_ms / 1000 * f)
    fully_shard(model.a)
    fully_shard(model.b)
    fully_shard(model)
    if args.user_comm:
        model.a.set_custom_all_gather(UserAllGather())
    run = instrument.TrainingRun(timer=WallTimer())
    watched = False if args.no_watch else run.watch(model)
    steps = train(args, run, model, torch.optim.SGD(model.parameters(), lr=0.01))
    run.close()
    if args.report:
        with open(args.report, "w") as out:
            json.dump({"rank": rank, "watched": watched, "loop_steps": steps, **totals(reader),
                       "user_comm_calls": UserAllGather.calls, "timed_calls": run._fsdp.total_calls,
                       "user_comm_wrapped": isinstance(getattr(comm(model.a), "inner", None), UserAllGather),
                       "warnings": warned.messages}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
