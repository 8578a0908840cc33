"""PyTorch Lightning callback recording a fit into a gpuobs TrainingRun.

    from gpuobs import instrument
    from gpuobs.instrument.integrations.lightning import GpuobsCallback

    instrument.configure()
    trainer = lightning.pytorch.Trainer(callbacks=[GpuobsCallback(tokens_fn=lambda b: b["input_ids"].numel())])

What it maps (hooks as Lightning 2.x calls them):

- a step is one optimizer step: it opens at the on_train_batch_start of its first batch and closes
  at the on_train_batch_end of the batch during which on_before_optimizer_step fired (or after
  ``trainer.accumulate_grad_batches`` batches, whichever comes first);
- with ``accumulate_grad_batches > 1`` every batch is a micro-step (a child span of the step);
- samples: the batch's leading dimension when a tensor-like can be found (or ``samples_fn(batch)``),
  tokens: ``tokens_fn(batch)`` if given; both must be cheap Python ints (read a shape, not a sum);
- loss: a reference to ``outputs["loss"]`` (or ``outputs`` itself when a tensor), multiplied back by
  the accumulation count Lightning divided it by; ``outputs["grad_norm"]`` when present; learning
  rate: the stepping optimizer's first param group. All read lazily at the TrainingRun's reporting
  interval (``.item()`` is never called per batch) and at on_train_end, which flushes;
- data wait: the loader's own fetches. From on_train_start the callback times each ``next()`` the
  fit loop calls on its data fetcher (``trainer.fit_loop._data_fetcher``; see
  _common.time_fetches), and its iter() at each later epoch's start (worker start-up): a fetch
  before a step is the step's data wait, one between micro-batches the step's own. Hooks and
  collectives between batches are not data wait. Where no timed fetch came before a batch (a
  Lightning without that fetcher, or one whose class cannot be swapped) the fallback is the gap:
  the time from the end of one training batch (or the epoch's start, the end of a validation pass
  or of a checkpoint) to the start of the next;
- phases (``train.forward``, ``train.backward``, ``train.optimizer`` spans): batch start to
  on_before_backward, on_before_backward to on_after_backward, on_before_optimizer_step to batch end;
- collectives: under DDP the callback times the gradient all-reduce, under FSDP2 (modules sharded by
  ``configure_model``) the all-gathers and reduce-scatters (``TrainingRun.watch`` on
  ``trainer.strategy.model``), so each rank's compute time names a straggler;
- checkpoints: ``trainer.save_checkpoint`` (which ModelCheckpoint and users call) is wrapped for the
  fit, so its whole duration (state collection, write, barrier) is recorded, with its path and
  global step. Where a save bypasses it, on_save_checkpoint (fired once the state is collected,
  before the write) starts the timing and the next hook this callback receives ends it: an upper
  bound;
- the run's ``train.run`` span ends at on_train_end.

Nothing here synchronizes CUDA: step times come from the TrainingRun's timer (CUDA events polled
without waiting, on a GPU). Requires ``lightning`` (or the legacy ``pytorch_lightning`` package);
importing gpuobs itself does not import either. Under ddp_spawn, let the callback create its
TrainingRun (the default) rather than passing one: callbacks are pickled to the workers.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, Callable

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # the legacy package name
    from pytorch_lightning import Callback as _Callback

from ..telemetry import Telemetry
from ..train import TrainingRun
from ._common import Scaled, batch_size, make_run, record_checkpoint, time_fetches

__all__ = ["GpuobsCallback"]


class _GpuobsHooks:
    """The callback's logic, independent of which Lightning package provides the base class."""

    def __init__(self, run: TrainingRun | None = None, *, telemetry: Telemetry | None = None,
                 samples_fn: Callable[[Any], int | None] | None = None,
                 tokens_fn: Callable[[Any], int | None] | None = None, flops_per_step: float | None = None,
                 peak_flops: float | None = None, report_interval_s: float = 10.0, sync: bool = False,
                 dtype: str | None = None):
        super().__init__()
        self._run = run
        self._telemetry = telemetry
        self._run_kwargs = dict(flops_per_step=flops_per_step, peak_flops=peak_flops,
                                report_interval_s=report_interval_s, sync=sync, dtype=dtype)
        self.samples_fn = samples_fn or batch_size
        self.tokens_fn = tokens_fn
        self._step: Any = None  # the open TrainingRun step (entered context manager)
        self._micro: Any = None  # the open micro-step
        self._batches = 0  # batches in the open step
        self._stepped = False  # on_before_optimizer_step fired during the current batch
        self._samples = self._tokens = 0
        self._saving = 0  # inside the wrapped trainer.save_checkpoint
        self._ckpt_mark: tuple[float, int] | None = None  # fallback timing from on_save_checkpoint
        self._wrapped: tuple[Any, Any] | None = None  # (trainer, wrapper) while save_checkpoint is wrapped
        self._fetch_from: tuple[float, int] | None = None  # (perf, ns) the loader was last known not fetching
        self._phase: Any = None  # the open phase span
        self._fetches = 0  # timed fetches since the last on_train_batch_start
        self._timed: tuple[Any, Any] | None = None  # (data fetcher, restore) while its fetches are timed

    @property
    def run(self) -> TrainingRun:
        """The TrainingRun recorded into (created on first use, over the current Telemetry)."""
        if self._run is None:
            self._run = make_run(None, self._telemetry, **self._run_kwargs)
        return self._run

    # ---- set-up and tear-down -----------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._ckpt_mark = None  # a save after an earlier fit, which no later hook timed
            self._wrap_save(trainer)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._wrap_save(trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._unwrap_save()
        self._untime_fetcher()

    def _wrap_save(self, trainer: Any) -> None:
        original = getattr(trainer, "save_checkpoint", None)
        if self._wrapped is not None or not callable(original):
            return

        @functools.wraps(original)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            self._finish_checkpoint()
            self._saving += 1
            path = args[0] if args else kwargs.get("filepath", "")
            try:
                with self.run.checkpoint(path=path, step=getattr(trainer, "global_step", "")):
                    return original(*args, **kwargs)
            finally:
                self._saving -= 1
                self._not_fetching()

        try:
            trainer.save_checkpoint = save_checkpoint
        except AttributeError:  # a trainer that cannot take the attribute: on_save_checkpoint timing only
            return
        self._wrapped = (trainer, save_checkpoint)

    def _unwrap_save(self) -> None:
        if self._wrapped is None:
            return
        trainer, wrapper = self._wrapped
        self._wrapped = None
        if getattr(trainer, "__dict__", {}).get("save_checkpoint") is wrapper:
            del trainer.save_checkpoint

    # ---- the fit loop -------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = getattr(trainer, "optimizers", None)
        if optimizers:
            self.run.report(lr=optimizers[0])
        self.run.watch(getattr(getattr(trainer, "strategy", None), "model", None) or pl_module)
        self._time_fetcher(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._time_fetcher(trainer)  # a new fetcher when the train dataloader was reloaded
        self._not_fetching()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._not_fetching()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._finish_checkpoint()
        run = self.run
        fetch, self._fetch_from = self._fetch_from, None
        fetched, self._fetches = self._fetches, 0
        if fetch is not None and not fetched:  # no timed fetch: the gap since the last batch ended
            run.add_data_wait(time.perf_counter() - fetch[0], fetch[1])
        if self._step is None:
            self._step = run.step()
            self._step.__enter__()
            self._batches, self._samples, self._tokens = 0, 0, 0
        self._stepped = False
        if _accumulate(trainer) > 1:
            self._micro = run.micro_step()
            self._micro.__enter__()
        samples = self.samples_fn(batch)
        if samples:
            self._samples += int(samples)
        if self.tokens_fn is not None:
            tokens = self.tokens_fn(batch)
            if tokens:
                self._tokens += int(tokens)
        self._open_phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._open_phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._close_phase()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True
        self.run.report(lr=optimizer)  # a reference; its lr is read at the reporting interval
        self._open_phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._finish_checkpoint()
        self._close_phase()
        self._close_micro()
        self._report(trainer, pl_module, outputs)
        self._batches += 1
        if self._stepped or self._batches >= _accumulate(trainer):
            self._close_step()
        self._not_fetching()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish_checkpoint()
        self._close_phase()
        self._close_micro()
        self._close_step()  # one left open by an epoch cut short
        self._fetch_from = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish_checkpoint()
        self._close_phase()
        self._close_micro()
        self._close_step()
        self.run.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish_checkpoint()
        self._close_phase(exception)
        self._close_micro(exception)
        self._close_step(exception)
        self.run.close()
        self._unwrap_save()
        self._untime_fetcher()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        if not self._saving:  # a save that bypassed trainer.save_checkpoint
            self._finish_checkpoint()
            self._ckpt_mark = (time.perf_counter(), time.time_ns())

    # ---- helpers ------------------------------------------------------------------------------

    def _report(self, trainer: Any, pl_module: Any, outputs: Any) -> None:
        grad_norm = None
        if isinstance(outputs, Mapping):
            loss, grad_norm = outputs.get("loss"), outputs.get("grad_norm")
        else:
            loss = outputs if hasattr(outputs, "item") else None
        if loss is not None and getattr(pl_module, "automatic_optimization", False):
            accumulate = _accumulate(trainer)
            if accumulate > 1:  # Lightning divided the loss it hands us by the accumulation count
                loss = Scaled(loss, accumulate)
        self.run.report(loss=loss, grad_norm=grad_norm)

    def _time_fetcher(self, trainer: Any) -> None:
        """Times the fit loop's data fetcher (once per fetcher object; the previous one is restored)."""
        fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
        if fetcher is None or (self._timed is not None and self._timed[0] is fetcher):
            return
        self._untime_fetcher()
        restore = time_fetches(fetcher, self._fetched, is_iterator=True)
        if restore is not None:
            self._timed = (fetcher, restore)

    def _untime_fetcher(self) -> None:
        timed, self._timed = self._timed, None
        if timed is not None:
            timed[1]()

    def _fetched(self, seconds: float, start_ns: int) -> None:
        """One timed fetch: data wait (the step's own when a step is open: between micro-batches)."""
        self._fetches += 1
        self.run.add_data_wait(seconds, start_ns)

    def _not_fetching(self) -> None:
        self._fetch_from = (time.perf_counter(), time.time_ns())

    def _open_phase(self, name: str) -> None:
        self._close_phase()
        if self._step is not None and self.run.tracing:
            self._phase = self.run.phase(name)
            self._phase.__enter__()

    def _close_phase(self, exc: BaseException | None = None) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.__exit__(type(exc) if exc else None, exc, None)

    def _close_micro(self, exc: BaseException | None = None) -> None:
        micro, self._micro = self._micro, None
        if micro is not None:
            micro.__exit__(type(exc) if exc else None, exc, None)

    def _close_step(self, exc: BaseException | None = None) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        step.samples = self._samples or None  # known only now under gradient accumulation
        step.tokens = self._tokens or None
        step.__exit__(type(exc) if exc else None, exc, None)

    def _finish_checkpoint(self) -> None:
        mark, self._ckpt_mark = self._ckpt_mark, None
        if mark is not None:
            record_checkpoint(self.run, time.perf_counter() - mark[0], mark[1], timing="on_save_checkpoint")


def _accumulate(trainer: Any) -> int:
    try:
        return max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
    except (TypeError, ValueError):
        return 1


class GpuobsCallback(_GpuobsHooks, _Callback):
    """Lightning callback recording steps, micro-steps, samples/tokens, loss, learning rate and
    checkpoints into a gpuobs TrainingRun (see the module docstring for the mapping).

    run: a TrainingRun to record into (default: one created at first use over the current
    Telemetry, with flops_per_step, peak_flops, dtype (peak FLOP/s looked up for the GPU), report_interval_s
    and sync passed on);
    samples_fn(batch) / tokens_fn(batch): cheap per-batch counts (default samples: the batch's
    leading dimension)."""

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a Lightning checkpoint: one per trainer, whatever its arguments."""
        return "GpuobsCallback"


def __getattr__(name: str) -> Any:
    """LegacyGpuobsCallback: the same callback on pytorch_lightning.Callback, for code that still
    uses the pytorch_lightning package alongside lightning (its Trainer accepts only its own class)."""
    if name == "LegacyGpuobsCallback":
        import pytorch_lightning

        cls = type("LegacyGpuobsCallback", (_GpuobsHooks, pytorch_lightning.Callback),
                   {"__doc__": GpuobsCallback.__doc__, "__module__": __name__,
                    "state_key": property(lambda self: "GpuobsCallback")})
        globals()[name] = cls
        return cls
    raise AttributeError(name)
