"""A small CPU training loop instrumented with gpuobs: steps, micro-steps, data waits, phases,
checkpoints, loss and learning rate, plus an evaluation request every --eval-every steps, go to
OpenTelemetry (OTLP and/or a Prometheus endpoint); logs carry trace ids (Fluentd or stdout).

    GPUOBS_PROMETHEUS_PORT=9464 RANK=0 WORLD_SIZE=1 python examples/train.py --steps 200
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/train.py

The model is a linear regression fitted by SGD on synthetic data, in plain Python: no GPU, no
torch needed. --data-ms and --compute-ms add sleeps so that data waits and step times look real.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time

from gpuobs import instrument

log = logging.getLogger("train")


def batches(n_features: int, batch_size: int, data_ms: float, seed: int):
    """Endless synthetic batches of (x, y) with y = w_true . x + noise; sleeps data_ms per batch."""
    rng = random.Random(seed)
    w_true = [rng.uniform(-1, 1) for _ in range(n_features)]
    while True:
        time.sleep(data_ms / 1000)
        xs = [[rng.gauss(0, 1) for _ in range(n_features)] for _ in range(batch_size)]
        yield xs, [sum(w * x for w, x in zip(w_true, row)) + rng.gauss(0, 0.01) for row in xs]


class Sgd:
    """Plain SGD with a torch-like param_groups, so gpuobs can read the learning rate lazily."""

    def __init__(self, n: int, lr: float):
        self.w = [0.0] * n
        self.param_groups = [{"lr": lr}]
        self.grad_norm = 0.0

    def step(self, xs, ys) -> float:
        lr, n = self.param_groups[0]["lr"], len(xs)
        grad = [0.0] * len(self.w)
        loss = 0.0
        for row, y in zip(xs, ys):
            err = sum(w * x for w, x in zip(self.w, row)) - y
            loss += err * err / n
            for j, x in enumerate(row):
                grad[j] += 2 * err * x / n
        self.w = [w - lr * g for w, g in zip(self.w, grad)]
        self.grad_norm = sum(g * g for g in grad) ** 0.5
        return loss


class FaultFile:
    """Faults a test or the demo asks this rank to play, one name per line of a file (--fault-file),
    each played once when it appears: `collective_timeout` logs the message PyTorch's NCCL watchdog
    logs when a collective times out (the job would then abort; this example carries on);
    `gpu_throttled` makes each step's compute take `throttled` times as long (its GPU's clocks held
    down, e.g. in HW thermal slowdown) until `gpu_recovered` puts it back (compute_scale: the
    factor now, 1.0 unthrottled). Checked once a step by the file's size, so a step without a new
    fault costs one stat()."""

    MESSAGES = {
        "collective_timeout": "[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective operation "
                              "timeout: WorkNCCL(SeqNum={step}, OpType=ALLREDUCE, NumelIn=1048576, "
                              "NumelOut=1048576, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.",
    }

    STATES = ("gpu_throttled", "gpu_recovered")  # faults that change how the rank computes until undone

    def __init__(self, path: str | None, throttled: float = 1.4):
        self.path, self.read = path, 0
        self.throttled = throttled
        self.compute_scale = 1.0

    def play(self, rank: int, step: int) -> None:
        """Play each fault added to the file since the last call: log its message, or set compute_scale
        (STATES); unknown names are logged as such."""
        try:
            if self.path is None or os.stat(self.path).st_size <= self.read:
                return
            with open(self.path) as f:
                f.seek(self.read)
                new = f.read()
        except OSError:
            return
        self.read += len(new.encode())
        for name in new.split():
            message = self.MESSAGES.get(name)
            if name in self.STATES:
                self.compute_scale = self.throttled if name == "gpu_throttled" else 1.0
                log.warning("compute per step now x%.2f", self.compute_scale, extra={"fault": name})
            elif message is None:
                log.warning("unknown fault in the fault file", extra={"fault": name})
            else:
                log.error(message.format(rank=rank, step=step))


def evaluate(opt: Sgd, xs) -> None:
    """An inference-style request on the current weights, recorded with the GenAI metric names."""
    with instrument.request(model="linear-regression", operation="predict", batch_size=len(xs)) as r:
        preds = []
        for row in xs:
            preds.append(sum(w * x for w, x in zip(opt.w, row)))
            r.first_token()
        r.tokens(input=len(xs) * len(xs[0]), output=len(preds))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--tokens-per-sample", type=int, default=512, help="pretend sequence length")
    p.add_argument("--data-ms", type=float, default=5.0, help="simulated data-loading time per batch")
    p.add_argument("--compute-ms", type=float, default=20.0, help="simulated compute time per step")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--accumulate", type=int, default=2, help="micro-steps per optimizer step")
    p.add_argument("--eval-every", type=int, default=100, help="steps between evaluation requests")
    p.add_argument("--slow-every", type=int, default=0, help="every Nth step is slow (0: none), e.g. a straggler")
    p.add_argument("--slow-ms", type=float, default=100.0, help="extra compute time of a slow step")
    p.add_argument("--fault-file", help="a file of fault names to play, e.g. collective_timeout (see FaultFile)")
    p.add_argument("--throttled", type=float, default=1.4,
                   help="compute time factor while the fault file says gpu_throttled (its GPU's clocks held down)")
    args = p.parse_args()

    telemetry = instrument.configure(service_name="gpuobs-example-train")
    _setup_logs()
    run = instrument.TrainingRun(telemetry, flops_per_step=6 * args.features * args.batch_size * 1e6,
                                 peak_flops=1e12, report_interval_s=1.0)
    opt = Sgd(args.features, args.lr)
    rank = telemetry.env.rank or 0
    log.info("training starts", extra={"steps": args.steps, "rank": rank})
    data = run.data(batches(args.features, args.batch_size, args.data_ms, seed=rank))
    faults = FaultFile(args.fault_file, args.throttled)
    for step, (xs, ys) in zip(range(1, args.steps + 1), data):
        with run.step(samples=len(xs), tokens=len(xs) * args.tokens_per_sample):
            with run.phase("forward_backward"):
                for _ in range(args.accumulate):  # gradient accumulation: micro-steps inside the step
                    with run.micro_step():
                        time.sleep(args.compute_ms * faults.compute_scale / 1000 / args.accumulate)
                if args.slow_every and step % args.slow_every == 0:  # a slow step: its trace is an exemplar
                    time.sleep(args.slow_ms / 1000)
            with run.phase("optimizer"):
                loss = opt.step(xs, ys)
            if step % args.checkpoint_every == 0:
                with run.checkpoint(path=f"checkpoints/step-{step}"):
                    time.sleep(0.05)  # stand-in for writing the weights
                    log.info("checkpoint saved", extra={"step": step})
        run.report(loss=loss, grad_norm=opt.grad_norm, lr=opt)
        faults.play(rank, step)
        if step % args.eval_every == 0:
            evaluate(opt, xs)
        if step % 50 == 0:
            opt.param_groups[0]["lr"] *= 0.9  # decay, so the lr series moves
    run.close()  # records what is pending and ends the run's span
    log.info("training done", extra={"final_loss": loss})
    telemetry.end()  # marks the normal end for one more scrape (no TrainingTargetDown), then shuts down


def _setup_logs() -> None:
    try:
        from gpuobs import logs
        configure = getattr(logs, "configure", None)
    except ImportError:
        configure = None
    if configure:
        configure()  # Fluentd when GPUOBS_FLUENTD is set, else JSON lines on stdout
    else:
        logging.basicConfig(level=logging.INFO)


if __name__ == "__main__":
    main()
