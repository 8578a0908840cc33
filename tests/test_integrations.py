"""Framework integrations: the Lightning callback, the transformers TrainerCallback and the OTel
BaseInstrumentor entry point.

Each callback is driven through its framework's hook sequence with stand-in trainer/state/args
objects (a stub base class stands in for the framework when it is not installed), and, where the
`integrations` extra is installed (torch CPU, lightning, transformers), through a real tiny fit,
whose recorded hook order is also checked against the sequence the stand-in tests drive."""

from __future__ import annotations

import importlib
import json
import os
import random
import socket
import subprocess
import sys
import time
import types
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuobs.instrument import RunEnv, TrainingRun, WallTimer, configure, current, telemetry

# --------------------------------------------------------------------------------------- fixtures


class Tel:
    """Telemetry wired to in-memory readers, with helpers to read what was recorded."""

    def __init__(self):
        self.reader = InMemoryMetricReader()
        self.spans_exp = InMemorySpanExporter()
        self.tel = configure(span_exporters=[self.spans_exp], metric_readers=[self.reader],
                             env=RunEnv(rank=0, job_id="t"))

    def run(self, **kw) -> TrainingRun:
        return TrainingRun(self.tel, timer=WallTimer(), **kw)

    def points(self, name: str) -> list:
        for rm in self.reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        return list(m.data.data_points)
        return []

    def total(self, name: str, **attrs) -> float:
        return sum(p.value for p in self.points(name) if attrs.items() <= dict(p.attributes).items())

    def gauge(self, name: str) -> float | None:
        pts = self.points(name)
        return pts[-1].value if pts else None

    def hist(self, name: str) -> tuple[int, float]:
        pts = self.points(name)
        return sum(p.count for p in pts), sum(p.sum for p in pts)

    def spans(self) -> list:
        self.tel.tracer_provider.force_flush()
        return list(self.spans_exp.get_finished_spans())


@pytest.fixture
def tel():
    t = Tel()
    yield t
    configure(enabled=False)


def _load(module: str, framework: str, stub: dict[str, type]):
    """Import gpuobs's integration module; with the framework missing, against stub modules (which
    are removed again, with the module bound to them, when the test ends)."""
    name = f"gpuobs.instrument.integrations.{module}"
    try:
        importlib.import_module(framework)
    except ImportError:
        pass
    else:
        yield importlib.import_module(name)
        return
    saved = {k: sys.modules.get(k) for k in (name, *stub)}
    parts = {}
    for modname, base in stub.items():
        parts[modname] = mod = types.ModuleType(modname)
        setattr(mod, base.__name__, base)
        sys.modules[modname] = mod
    for modname, mod in parts.items():  # lightning.pytorch as an attribute of lightning
        parent, _, child = modname.rpartition(".")
        if parent in parts:
            setattr(parts[parent], child, mod)
    sys.modules.pop(name, None)
    try:
        yield importlib.import_module(name)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@pytest.fixture
def pl_mod():
    yield from _load("lightning", "lightning.pytorch",
                     {"lightning": type("_Unused", (), {}), "lightning.pytorch": type("Callback", (), {})})


@pytest.fixture
def hf_mod():
    yield from _load("huggingface", "transformers", {"transformers": type("TrainerCallback", (), {})})


class CountingTensor:
    """A 0-d tensor stand-in whose .item() counts its calls (each would be a CUDA sync)."""
    calls = 0

    def __init__(self, value: float):
        self.value = value

    def item(self) -> float:
        CountingTensor.calls += 1
        return self.value


class Batch:
    def __init__(self, n: int, seq: int = 8):
        self.shape = (n, seq)


# ------------------------------------------------------------------------ documented hook orders


def lightning_sequence(batches: int, accumulate: int) -> list[str]:
    """Callback hooks of a Lightning 2.x fit with no validation and ModelCheckpoint saving at the
    epoch end (it runs after the other callbacks' on_train_epoch_end)."""
    seq = ["setup", "on_fit_start", "on_train_start", "on_train_epoch_start"]
    for i in range(batches):
        seq.append("on_train_batch_start")
        if (i + 1) % accumulate == 0 or i == batches - 1:
            seq.append("on_before_optimizer_step")
        seq.append("on_train_batch_end")
    return seq + ["on_train_epoch_end", "on_save_checkpoint", "on_train_end", "on_fit_end", "teardown"]


def hf_sequence(steps: int, accumulation: int, save_every: int) -> list[str]:
    """Callback hooks of transformers.Trainer.train with logging every step and saving every
    save_every steps (and at the last one); the last on_log carries the run's summary."""
    seq = ["on_train_begin", "on_epoch_begin"]
    for s in range(1, steps + 1):
        seq += ["on_step_begin", *["on_substep_end"] * (accumulation - 1), "on_pre_optimizer_step",
                "on_optimizer_step", "on_step_end", "on_log"]
        if s % save_every == 0 or s == steps:
            seq.append("on_save")
    return seq + ["on_epoch_end", "on_log", "on_train_end"]


# ------------------------------------------------------------------------------- Lightning stand-in


class StandInTrainer:
    """What the callback reads from a Lightning Trainer; save_checkpoint calls the callbacks'
    on_save_checkpoint the way Trainer.save_checkpoint does (after collecting the state)."""

    def __init__(self, callbacks, accumulate: int = 1, save_s: float = 0.0):
        self.callbacks, self.accumulate_grad_batches, self.save_s = callbacks, accumulate, save_s
        self.optimizers = [SimpleNamespace(param_groups=[{"lr": 0.05}])]

    def save_checkpoint(self, filepath, weights_only=None):
        for cb in self.callbacks:
            cb.on_save_checkpoint(self, None, {})
        time.sleep(self.save_s)


def drive_lightning(cb, trainer, module, losses, batch_size=4, save=True):
    """Call cb's hooks in lightning_sequence order, as Lightning's fit loop would."""
    seq = lightning_sequence(len(losses), trainer.accumulate_grad_batches)
    it = iter(enumerate(losses))
    for hook in seq:
        if hook in ("setup", "teardown"):
            cb.__getattribute__(hook)(trainer, module, "fit")
        elif hook == "on_train_batch_start":
            i, loss = next(it)
            batch = {"input_ids": Batch(batch_size), "labels": Batch(batch_size)}
            cb.on_train_batch_start(trainer, module, batch, i)
        elif hook == "on_before_optimizer_step":
            cb.on_before_optimizer_step(trainer, module, trainer.optimizers[0])
        elif hook == "on_train_batch_end":
            out = {"loss": CountingTensor(loss / trainer.accumulate_grad_batches)}
            cb.on_train_batch_end(trainer, module, out, batch, i)
        elif hook == "on_save_checkpoint":
            if save:
                trainer.save_checkpoint("last.ckpt")  # ModelCheckpoint's call
        elif hasattr(cb, hook):
            getattr(cb, hook)(trainer, module)


def test_lightning_hook_sequence_records_steps_micro_steps_loss_lr_and_checkpoint(tel, pl_mod):
    cb = pl_mod.GpuobsCallback(tel.run(), tokens_fn=lambda b: b["input_ids"].shape[0] * b["input_ids"].shape[1])
    trainer = StandInTrainer([cb], accumulate=2, save_s=0.02)
    module = SimpleNamespace(automatic_optimization=True)
    CountingTensor.calls = 0
    losses = [2.0, 1.8, 1.6, 1.5, 1.4]  # 5 batches, accumulate 2: steps of 2, 2 and the final 1
    drive_lightning(cb, trainer, module, losses)

    assert tel.total("gpuobs.training.steps") == 3
    assert tel.total("gpuobs.training.micro_steps") == 5
    assert tel.total("gpuobs.training.samples") == 20
    assert tel.total("gpuobs.training.tokens") == 5 * 4 * 8
    assert tel.gauge("gpuobs.training.loss") == pytest.approx(1.4)  # un-divided by the accumulation
    assert tel.gauge("gpuobs.training.learning_rate") == pytest.approx(0.05)
    count, seconds = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == 1 and seconds >= 0.02
    assert tel.total("gpuobs.training.badput", cause="checkpoint") == pytest.approx(seconds)
    assert CountingTensor.calls == 1  # only the flush at on_train_end read the (latest) loss
    assert "save_checkpoint" not in vars(trainer)  # unwrapped at teardown

    spans = tel.spans()
    steps = [s for s in spans if s.name == "train.step"]
    micros = [s for s in spans if s.name == "train.micro_step"]
    assert len(steps) == 3 and len(micros) == 5
    step_ids = {s.context.span_id for s in steps}
    assert all(m.parent is not None and m.parent.span_id in step_ids for m in micros)
    assert [s.name for s in spans].count("train.checkpoint") == 1


def test_lightning_never_reads_tensors_per_batch(tel, pl_mod):
    cb = pl_mod.GpuobsCallback(tel.run(report_interval_s=3600))
    trainer = StandInTrainer([cb])
    CountingTensor.calls = 0
    drive_lightning(cb, trainer, SimpleNamespace(automatic_optimization=True), [1.0] * 50, save=False)
    assert CountingTensor.calls == 1
    assert tel.total("gpuobs.training.steps") == 50
    assert tel.total("gpuobs.training.micro_steps") == 0  # no accumulation: a batch is a step


def test_lightning_checkpoint_timed_from_on_save_checkpoint_without_wrapper(tel, pl_mod):
    cb = pl_mod.GpuobsCallback(tel.run())
    trainer = SimpleNamespace(accumulate_grad_batches=1, optimizers=[])  # no save_checkpoint to wrap
    module = SimpleNamespace(automatic_optimization=False)
    cb.setup(trainer, module, "fit")
    cb.on_train_start(trainer, module)
    cb.on_train_batch_start(trainer, module, [Batch(3)], 0)
    cb.on_train_batch_end(trainer, module, CountingTensor(0.5), [Batch(3)], 0)
    cb.on_save_checkpoint(trainer, module, {})
    time.sleep(0.02)
    cb.on_train_end(trainer, module)
    count, seconds = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == 1 and seconds >= 0.02
    assert tel.total("gpuobs.training.samples") == 3
    assert tel.gauge("gpuobs.training.loss") == pytest.approx(0.5)  # manual optimization: not rescaled


def test_lightning_exception_closes_the_open_step(tel, pl_mod):
    cb = pl_mod.GpuobsCallback(tel.run())
    trainer = StandInTrainer([cb])
    module = SimpleNamespace(automatic_optimization=True)
    cb.setup(trainer, module, "fit")
    cb.on_train_batch_start(trainer, module, Batch(2), 0)
    cb.on_exception(trainer, module, RuntimeError("boom"))
    assert "save_checkpoint" not in vars(trainer)
    (step,) = [s for s in tel.spans() if s.name == "train.step"]
    assert not step.status.is_ok


# ------------------------------------------------------------------------------ transformers stand-in


def drive_hf(cb, args, state, losses, save_every=2, save_s=0.0):
    """Call cb's hooks in hf_sequence order, with the state and logs the Trainer would pass."""
    control = SimpleNamespace()
    epoch_ended = False
    for hook in hf_sequence(len(losses), args.gradient_accumulation_steps, save_every):
        if hook == "on_step_begin":
            loss = losses[state.global_step]
        if hook in ("on_substep_end", "on_pre_optimizer_step"):  # after a micro-batch's training_step
            state.num_input_tokens_seen += 64 * args.world_size  # summed over processes by the Trainer
        if hook == "on_step_end":
            state.global_step += 1
        if hook == "on_log":
            logs = ({"train_runtime": 1.0, "train_loss": 7.0, "epoch": 1.0} if epoch_ended else
                    {"loss": loss, "grad_norm": loss / 10, "learning_rate": 1e-3 * state.global_step, "epoch": 0.5})
            cb.on_log(args, state, control, logs=logs)
        elif hook == "on_save":
            time.sleep(save_s)  # Trainer._save_checkpoint runs before on_save
            cb.on_save(args, state, control)
        else:
            if hasattr(cb, hook):  # a stub TrainerCallback base has no no-op hooks
                getattr(cb, hook)(args, state, control, model=None, optimizer=None)
        epoch_ended = epoch_ended or hook == "on_epoch_end"


def hf_args(accumulation=2, batch=4, world=1):
    return SimpleNamespace(gradient_accumulation_steps=accumulation, train_batch_size=batch,
                           per_device_train_batch_size=batch, world_size=world)


def test_hf_hook_sequence_records_steps_micro_steps_logs_and_checkpoints(tel, hf_mod):
    cb = hf_mod.GpuobsTrainerCallback(tel.run())
    args, state = hf_args(accumulation=3, world=2), SimpleNamespace(global_step=0, num_input_tokens_seen=0)
    drive_hf(cb, args, state, [2.5, 2.0, 1.5, 1.25], save_every=2, save_s=0.05)

    assert tel.total("gpuobs.training.steps") == 4
    assert tel.total("gpuobs.training.micro_steps") == 12
    assert tel.total("gpuobs.training.samples") == 4 * 3 * 4
    assert tel.total("gpuobs.training.tokens") == 4 * 3 * 64  # this rank's share
    assert tel.gauge("gpuobs.training.loss") == pytest.approx(1.25)
    assert tel.gauge("gpuobs.training.grad_norm") == pytest.approx(0.125)
    assert tel.gauge("gpuobs.training.learning_rate") == pytest.approx(4e-3)
    count, seconds = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == 2 and 0.1 <= seconds < 2.0
    assert tel.total("gpuobs.training.badput", cause="checkpoint") == pytest.approx(seconds)
    assert tel.total("gpuobs.training.badput", cause="idle") < 0.025  # the save between steps is not idle too

    spans = tel.spans()
    names = [s.name for s in spans]
    assert names.count("train.step") == 4 and names.count("train.micro_step") == 12
    assert names.count("train.optimizer") == 4 and names.count("train.checkpoint") == 2
    step_ids = {s.context.span_id for s in spans if s.name == "train.step"}
    for s in spans:
        if s.name in ("train.micro_step", "train.optimizer"):
            assert s.parent.span_id in step_ids
    micro_ends = max(s.end_time for s in spans if s.name == "train.micro_step")
    assert micro_ends <= max(s.start_time for s in spans if s.name == "train.optimizer")


def test_hf_without_accumulation_and_eval_logs(tel, hf_mod):
    cb = hf_mod.GpuobsTrainerCallback(tel.run(), samples_per_micro_step=7)
    args, state = hf_args(accumulation=1), SimpleNamespace(global_step=0, num_input_tokens_seen=0)
    drive_hf(cb, args, state, [1.0, 0.5], save_every=10)
    cb.on_log(args, state, None, logs={"eval_loss": 9.0, "epoch": 1.0})  # evaluation: not the training loss
    cb.on_train_end(args, state, None)
    assert tel.total("gpuobs.training.steps") == 2
    assert tel.total("gpuobs.training.micro_steps") == 0
    assert tel.total("gpuobs.training.samples") == 14
    assert tel.gauge("gpuobs.training.loss") == pytest.approx(0.5)


# ------------------------------------------------------------------------------ timed loader fetches


class SlowLoader:
    """A loader whose items each take sleep_s, hiding __class__ behind a read-only property the way
    accelerate's DataLoaderAdapter (the loader transformers.Trainer iterates) does."""

    def __init__(self, n: int, sleep_s: float):
        self.n, self.sleep_s = n, sleep_s

    @property
    def __class__(self):
        return list

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.sleep_s)
            yield i


class SlowFetcher:
    """An object the loop calls next() on directly, as Lightning's fit loop does its data fetcher."""

    def __init__(self, n: int, sleep_s: float):
        self.n, self.sleep_s, self.i = n, sleep_s, 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        time.sleep(self.sleep_s)
        self.i += 1
        return self.i


def test_time_fetches_times_each_fetch_and_restores_the_class():
    from gpuobs.instrument.integrations._common import time_fetches

    fetches = []
    loader = SlowLoader(3, 0.01)
    restore = time_fetches(loader, lambda s, ns: fetches.append(s))
    assert restore is not None and type(loader).__name__ == "SlowLoader" and isinstance(loader, SlowLoader)
    assert list(loader) == [0, 1, 2] and list(loader) == [0, 1, 2]  # a new timed pass per iter()
    timed = [s for s in fetches if s > 0.009]
    assert len(fetches) == 2 * 4 and len(timed) == 2 * 3  # iter() itself, then 3 items (the end is no fetch)
    restore()
    assert type(loader) is SlowLoader
    list(loader)
    assert len(fetches) == 8

    fetcher, seen = SlowFetcher(2, 0.01), []
    restore = time_fetches(fetcher, lambda s, ns: seen.append(s), is_iterator=True)
    assert list(iter(fetcher)) == [1, 2] and next(iter(fetcher)) == 1
    assert len(seen) == 6 and sum(s > 0.009 for s in seen) == 3  # 3 iter() (list() calls it again), 3 items
    restore()
    assert type(fetcher) is SlowFetcher

    assert time_fetches([1, 2], lambda s, ns: None) is None  # a builtin's class cannot be swapped
    assert time_fetches(SlowLoader(1, 0), lambda s, ns: None, is_iterator=True) is None  # no __next__


def test_hf_data_wait_is_the_timed_fetches_not_the_time_before_the_hook(tel, hf_mod):
    cb = hf_mod.GpuobsTrainerCallback(tel.run())
    args, state, control = hf_args(accumulation=2), SimpleNamespace(global_step=0, num_input_tokens_seen=0), None
    loader = SlowLoader(8, 0.01)
    cb.on_train_begin(args, state, control, model=None, train_dataloader=loader)
    cb.on_epoch_begin(args, state, control)
    it = iter(loader)
    for _ in range(4):
        next(it), next(it)  # the step's two micro-batches, as get_batch_samples fetches them
        time.sleep(0.03)  # the num_items_in_batch gather, waiting for a slower rank
        cb.on_step_begin(args, state, control)
        cb.on_substep_end(args, state, control)
        cb.on_step_end(args, state, control)
    cb.on_train_end(args, state, control)
    count, seconds = tel.hist("gpuobs.training.data_wait.duration")
    assert count == 4 and 0.08 <= seconds < 0.08 + 0.03  # 8 fetches of 10 ms: none of the 4 x 30 ms gathers
    assert type(loader) is SlowLoader  # restored at on_train_end


# ------------------------------------------------------------------------------------ instrumentor


def test_importing_gpuobs_imports_no_framework():
    code = ("import sys, gpuobs, gpuobs.instrument, gpuobs.instrument.integrations, gpuobs.instrument.instrumentor\n"
            "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_instrumentor_configures_and_shuts_down():
    """instrument(...) configures gpuobs from its arguments; uninstrument() shuts it down."""
    from gpuobs.instrument.instrumentor import GpuobsInstrumentor

    reader = InMemoryMetricReader()
    inst = GpuobsInstrumentor()
    assert list(inst.instrumentation_dependencies()) == []
    try:
        inst.instrument(metric_readers=[reader], env=RunEnv(rank=0), distro_option="ignored")
        assert inst.is_instrumented_by_opentelemetry
        tel = current()
        assert tel.enabled
        with TrainingRun(timer=WallTimer()).step(samples=5):
            pass
        names = {m.name for rm in reader.get_metrics_data().resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics}
        assert "gpuobs.training.steps" in names
    finally:
        inst.uninstrument()
    assert not inst.is_instrumented_by_opentelemetry
    assert not current().enabled
    assert telemetry.current() is not tel


def test_instrumentor_uses_the_providers_it_is_given():
    """A distro (or the application) hands its own SDK providers to instrument(): gpuobs records
    into them, and uninstrument() flushes them but leaves them running for their owner."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gpuobs.instrument.instrumentor import GpuobsInstrumentor

    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader])
    inst = GpuobsInstrumentor()
    try:
        inst.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider, env=RunEnv(rank=0))
        assert current().enabled and current().tracer_provider is tracer_provider
        run = TrainingRun(timer=WallTimer())
        with run.step(samples=5):
            pass
    finally:
        inst.uninstrument()
    assert [s.name for s in spans.get_finished_spans()] == ["train.step", "train.run"]  # the run ended too
    points = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics}
    assert points["gpuobs.training.steps"].data.data_points[0].value == 1
    tracer_provider.get_tracer("after").start_span("still-running").end()  # not shut down
    assert spans.get_finished_spans()[-1].name == "still-running"


def test_instrumentor_entry_point_is_registered():
    (ep,) = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "gpuobs"]
    from gpuobs.instrument.instrumentor import GpuobsInstrumentor

    assert ep.load() is GpuobsInstrumentor


def test_opentelemetry_instrument_command_configures_gpuobs():
    command = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
    if not os.path.exists(command):
        pytest.skip("opentelemetry-instrument not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GPUOBS_PROMETHEUS_PORT": str(port), "OTEL_TRACES_EXPORTER": "none",
           "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    code = "from gpuobs.instrument import current; print(current().enabled)"
    out = subprocess.run([command, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# ------------------------------------------------------------------------------- real frameworks


class Recorder:
    """Mixin recording the hook names a real framework calls, in order."""

    def _hooks(self, names):
        self.calls = []
        for name in names:
            setattr(self, name, (lambda n: lambda *a, **k: self.calls.append(n))(name))


def lightning_regressor(torch, pl):
    """A one-layer regression LightningModule trained with SGD; `losses` keeps each step's loss."""

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model()


def test_real_lightning_fit(tel, tmp_path):
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    from gpuobs.instrument.integrations.lightning import GpuobsCallback

    hooks = sorted(set(lightning_sequence(1, 1)))
    recorder = type("Rec", (Recorder, pl.Callback), {})()
    recorder._hooks(hooks)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(20, 4), torch.randn(20, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    cb = GpuobsCallback(tel.run())
    trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[recorder, cb])
    model = lightning_regressor(torch, pl)
    trainer.fit(model, loader)

    assert recorder.calls == lightning_sequence(5, 2)  # the order the stand-in test drives
    assert tel.total("gpuobs.training.steps") == 3
    assert tel.total("gpuobs.training.micro_steps") == 5
    assert tel.total("gpuobs.training.samples") == 20
    assert tel.gauge("gpuobs.training.loss") == pytest.approx(model.losses[-1].item())
    assert tel.gauge("gpuobs.training.learning_rate") == pytest.approx(0.1)
    count, seconds = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == 1 and seconds > 0
    assert "save_checkpoint" not in vars(trainer)
    assert [s.name for s in tel.spans()].count("train.checkpoint") == 1


def hf_regressor(torch):
    """A one-layer regression model in the shape transformers.Trainer expects (a dict with the loss)."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.layer(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    return Model()


def test_real_transformers_trainer(tel, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpuobs.instrument.integrations.huggingface import GpuobsTrainerCallback

    hooks = sorted(set(hf_sequence(1, 2, 1)))
    recorder = type("Rec", (Recorder, transformers.TrainerCallback), {})()
    recorder._hooks(hooks)
    torch.manual_seed(0)
    rows = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(16)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=1,
        logging_steps=1, save_strategy="steps", save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True,
        remove_unused_columns=False, learning_rate=0.01, lr_scheduler_type="constant")
    cb = GpuobsTrainerCallback(tel.run())
    trainer = transformers.Trainer(model=hf_regressor(torch), args=args, train_dataset=rows,
                                   callbacks=[recorder, cb])
    trainer.train()

    assert recorder.calls == hf_sequence(4, 2, 2)  # the order the stand-in test drives
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert tel.total("gpuobs.training.steps") == 4
    assert tel.total("gpuobs.training.micro_steps") == 8
    assert tel.total("gpuobs.training.samples") == 16
    assert tel.gauge("gpuobs.training.loss") == pytest.approx(logged[-1]["loss"])
    assert tel.gauge("gpuobs.training.learning_rate") == pytest.approx(logged[-1]["learning_rate"])
    assert tel.gauge("gpuobs.training.grad_norm") == pytest.approx(logged[-1]["grad_norm"])
    count, seconds = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == 2 and seconds > 0


class SleepyData:
    """A map-style dataset whose __getitem__ sleeps a known time and records, with perf_counter,
    when each fetch ran: the ground truth the callbacks' data wait is checked against."""

    def __init__(self, torch, n: int, sleep_s: float, item):
        self.sleep_s, self.item, self.fetches = sleep_s, item, []
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        t0 = time.perf_counter()
        time.sleep(self.sleep_s)
        self.fetches.append((t0, time.perf_counter()))
        return self.item(self.x[i], self.y[i])

    def waited(self, first: float, last: float) -> float:
        """Seconds spent fetching between first (the loop was ready for data) and last (the last
        step began): what the training loop waited for data, as the dataset itself measured it."""
        return sum(t1 - t0 for t0, t1 in self.fetches if t0 >= first and t1 <= last)


class HookTimes:
    """Mixin recording when named hooks were called (perf_counter)."""

    def _hooks(self, names):
        self.times = {name: [] for name in names}
        for name in names:
            setattr(self, name, (lambda n: lambda *a, **k: self.times[n].append(time.perf_counter()))(name))


def _children(spans, parent) -> list:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
            and s.context.trace_id == parent.context.trace_id]


def _assert_data_wait(tel, measured: float, steps: int):
    badput = tel.total("gpuobs.training.badput", cause="data_wait")
    count, seconds = tel.hist("gpuobs.training.data_wait.duration")
    assert count == steps  # every step waited for its batch
    assert badput == pytest.approx(measured, rel=0.05)
    assert seconds == pytest.approx(measured, rel=0.05)


def test_real_lightning_fit_data_wait_phases_and_checkpoint(tel, tmp_path):
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    from gpuobs.instrument.integrations.lightning import GpuobsCallback

    ckpt = str(tmp_path / "mid.ckpt")

    class Saver(pl.Callback):  # after GpuobsCallback in the list: saves between steps
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 10:
                trainer.save_checkpoint(ckpt)

    class Busy(pl.Callback):  # work between batches that is not loading (a logger's sync, a collective)
        def on_train_batch_end(self, *args):
            time.sleep(0.008)

    times = type("Times", (HookTimes, pl.Callback), {})()
    times._hooks(["on_train_epoch_start", "on_train_batch_start"])
    # 40 samples, batch 2, 20 ms each: 40 ms of loading per batch (the loop's own overhead between
    # batches is under 1 ms), 30 steps crossing an epoch boundary
    data = SleepyData(torch, 40, 0.020, lambda x, y: (x, y))
    loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=0)
    cb = GpuobsCallback(tel.run())
    trainer = pl.Trainer(max_steps=30, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[times, cb, Saver(), Busy()])
    trainer.fit(lightning_regressor(torch, pl), loader)

    assert tel.total("gpuobs.training.steps") == 30
    measured = data.waited(times.times["on_train_epoch_start"][0], times.times["on_train_batch_start"][-1])
    assert measured > 30 * 0.040 * 0.9  # the wait dwarfs the loop's own overhead between batches
    _assert_data_wait(tel, measured, 30)  # Busy's 30 x 8 ms between batches (20 % of it) is not data wait

    spans = tel.spans()
    steps = [s for s in spans if s.name == "train.step"]
    assert len(steps) == 30
    for step in steps:
        phases = {s.name: s for s in _children(spans, step) if s.name != "train.data_wait"}
        assert sorted(phases) == ["train.backward", "train.forward", "train.optimizer"]
        fwd, bwd, opt = phases["train.forward"], phases["train.backward"], phases["train.optimizer"]
        assert step.start_time <= fwd.start_time <= fwd.end_time <= bwd.start_time <= bwd.end_time \
            <= opt.start_time <= opt.end_time <= step.end_time
        assert all(s.attributes["gpuobs.phase"] == s.name.split(".")[1] for s in phases.values())

    (run,) = [s for s in spans if s.name == "train.run"]
    (saved,) = [s for s in spans if s.name == "train.checkpoint"]
    assert os.path.isfile(ckpt)
    assert saved.attributes["gpuobs.checkpoint.path"] == ckpt
    assert saved.attributes["gpuobs.checkpoint.step"] == "10"
    assert saved.context.trace_id == run.context.trace_id and saved.parent.span_id == run.context.span_id
    assert run.start_time <= saved.start_time <= saved.end_time <= run.end_time
    count, seconds = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == 1 and seconds == pytest.approx((saved.end_time - saved.start_time) / 1e9, abs=1e-3)


def test_real_transformers_trainer_data_wait_and_checkpoint(tel, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpuobs.instrument.integrations.huggingface import GpuobsTrainerCallback

    times = type("Times", (HookTimes, transformers.TrainerCallback), {})()
    times._hooks(["on_epoch_begin", "on_step_begin"])
    data = SleepyData(torch, 64, 0.020, lambda x, y: {"x": x, "labels": y})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=20, logging_steps=5,
        save_strategy="steps", save_steps=15, report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False, learning_rate=0.01, lr_scheduler_type="constant")
    cb = GpuobsTrainerCallback(tel.run())
    trainer = transformers.Trainer(model=hf_regressor(torch), args=args, train_dataset=data, callbacks=[times, cb])
    trainer.train()

    assert tel.total("gpuobs.training.steps") == 20
    measured = data.waited(times.times["on_epoch_begin"][0], times.times["on_step_begin"][-1])
    assert measured > 20 * 0.040 * 0.9  # accelerate's loader fetches one batch ahead: 21 fetched
    _assert_data_wait(tel, measured, 20)

    spans = tel.spans()
    (run,) = [s for s in spans if s.name == "train.run"]
    saved = {s.attributes["gpuobs.checkpoint.step"]: s for s in spans if s.name == "train.checkpoint"}
    assert "15" in saved and set(saved) <= {"15", "20"}  # transformers 5 also saves at max_steps
    for step, span in saved.items():
        path = span.attributes["gpuobs.checkpoint.path"]
        assert path.endswith(f"checkpoint-{step}") and os.path.isdir(path)
        assert span.context.trace_id == run.context.trace_id and span.parent.span_id == run.context.span_id
    count, _ = tel.hist("gpuobs.training.checkpoint.duration")
    assert count == len(saved)


def test_legacy_pytorch_lightning_callback():
    pl_legacy = pytest.importorskip("pytorch_lightning")
    pytest.importorskip("lightning.pytorch")
    from gpuobs.instrument.integrations import lightning as integration

    cb = integration.LegacyGpuobsCallback()
    assert isinstance(cb, pl_legacy.Callback) and cb.state_key == "GpuobsCallback"
    assert hasattr(cb, "on_train_batch_end")


# ----------------------------------------------------------------- HF Trainer under 2-rank DDP (gloo)

HF_DDP_STEPS = 12
HF_DDP_SLEEP_S = (0.020, 0.060)  # per sample, by rank: rank 1's loader is 3x slower than rank 0's


def hf_ddp_rank(out: str) -> None:
    """One rank of a 2-process transformers.Trainer DDP job on gloo (launched by the test below,
    RANK/WORLD_SIZE/MASTER_* in the environment); writes what it measured to out as JSON.

    The model's forward takes **kwargs, so the Trainer counts `num_items_in_batch` and, with
    average_tokens_across_devices (the default), gathers it across ranks before on_step_begin: the
    fast rank waits there for the slow rank's loader, which is not its own data wait."""
    import torch
    import transformers

    from gpuobs.instrument.integrations.huggingface import GpuobsTrainerCallback

    rank = int(os.environ["RANK"])
    tel = Tel()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None, **kwargs):
            out = self.layer(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    times = type("Times", (HookTimes, transformers.TrainerCallback), {})()
    times._hooks(["on_epoch_begin", "on_step_begin", "on_step_end"])
    data = SleepyData(torch, HF_DDP_STEPS * 2 * 2, HF_DDP_SLEEP_S[rank], lambda x, y: {"x": x, "labels": y})
    args = transformers.TrainingArguments(
        output_dir=os.path.dirname(out), per_device_train_batch_size=2, num_train_epochs=1, logging_steps=1000,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, ddp_backend="gloo", ddp_timeout=60,
        ddp_find_unused_parameters=False, dataloader_num_workers=0, remove_unused_columns=False, learning_rate=0.01,
        lr_scheduler_type="constant")
    cb = GpuobsTrainerCallback(tel.run())
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=data, callbacks=[times, cb])
    trainer.train()
    assert trainer.model_accepts_loss_kwargs and args.average_tokens_across_devices and args.world_size == 2

    begins, ends = times.times["on_step_begin"], times.times["on_step_end"]
    # what the gap before each on_step_begin holds: the fetch, and the gather waiting for the other rank
    gap = sum(b - e for b, e in zip(begins, [times.times["on_epoch_begin"][0], *ends]))
    count, seconds = tel.hist("gpuobs.training.data_wait.duration")
    result = {"steps": tel.total("gpuobs.training.steps"), "count": count, "seconds": seconds,
              "badput": tel.total("gpuobs.training.badput", cause="data_wait"), "gap": gap,
              "truth": data.waited(times.times["on_epoch_begin"][0], begins[-1]), "fetches": len(data.fetches)}
    with open(out, "w") as f:
        json.dump(result, f)
    configure(enabled=False)


def test_real_transformers_ddp_data_wait_is_the_loaders_own_fetch(tmp_path):
    """Two ranks, rank 1's loader 3x slower: each rank's data wait is what its own dataset measured
    (within 5 %), not the gap before on_step_begin, which on rank 0 holds the wait in the gather."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpuobs.ports import free_port

    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    # the Trainers of earlier tests seeded `random` (transformers.set_seed(42)), which free_port draws
    # from: every run of this file would pick the same port, and two at once on a machine would meet
    random.seed()
    master = str(free_port())
    procs = []
    for rank in range(2):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPUOBS_"))},
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": master, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([repo, here])}
        code = f"import test_integrations as t; t.hf_ddp_rank({str(tmp_path / f'rank{rank}.json')!r})"
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs, deadline = [], time.monotonic() + 90  # before pytest-timeout, to show the ranks' output
    try:
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outputs.append(p.communicate()[0] + "\n(killed: no result in 90 s)")
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    fast, slow = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    for r in (fast, slow):
        assert r["steps"] == HF_DDP_STEPS and r["count"] == HF_DDP_STEPS
        assert r["fetches"] == HF_DDP_STEPS * 2
        assert r["truth"] > HF_DDP_STEPS * 2 * HF_DDP_SLEEP_S[0] * 0.9
    # the fast rank waited in the gather for the slow rank's loader: the gap before its step hook
    # is far above its own fetching (the measurement this test guards against)
    assert fast["gap"] > 2 * fast["truth"]
    for r in (fast, slow):
        assert r["seconds"] == pytest.approx(r["truth"], rel=0.05)
        assert r["badput"] == pytest.approx(r["truth"], rel=0.05)
