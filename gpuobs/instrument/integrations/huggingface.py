"""Hugging Face ``transformers.Trainer`` callback recording training into a gpuobs TrainingRun.

    from gpuobs import instrument
    from gpuobs.instrument.integrations.huggingface import GpuobsTrainerCallback

    instrument.configure()
    trainer = transformers.Trainer(..., callbacks=[GpuobsTrainerCallback()])

What it maps (the Trainer's inner loop, transformers 4.x/5.x)::

    on_step_begin                      first micro-batch of an optimizer step: the step opens
      training_step; on_substep_end    each micro-batch but the last (gradient accumulation)
      training_step                    the last micro-batch
      on_pre_optimizer_step ... on_optimizer_step      (an "optimizer" phase span)
    on_step_end                        the step closes
    on_log (loss, learning_rate, grad_norm) / on_evaluate / on_save

- micro-steps: with ``gradient_accumulation_steps > 1`` every micro-batch is one (a child span of
  the step), ending at on_substep_end, or on_pre_optimizer_step for the last one;
- samples per step: ``args.train_batch_size`` (per process) times the micro-batches of the step,
  unless samples_per_micro_step is given (a short last batch of an epoch is over-counted);
  tokens: the growth of ``state.num_input_tokens_seen`` (set ``include_num_input_tokens_seen``),
  which the Trainer sums over all processes, divided by ``args.world_size``;
- loss, learning_rate and grad_norm: taken from the logs dict of on_log (floats the Trainer has
  already read at its logging interval; evaluation logs are ignored) and set on the gauges at the
  TrainingRun's reporting interval and at on_train_end, which flushes;
- data wait: the loader's own fetches. At on_train_begin the callback times each ``next()`` on the
  iterators of the train dataloader the Trainer iterates (``train_dataloader`` in the hook's
  kwargs; see _common.time_fetches), and iter() itself (worker start-up). The Trainer fetches all
  micro-batches of an optimizer step before on_step_begin, so they are that step's data wait.
  What else runs before on_step_begin is not: under DDP the Trainer gathers ``num_items_in_batch``
  across ranks there (``average_tokens_across_devices``), where a fast rank waits for a slow one's
  loader. Where no timed fetch came before a step (a loader the Trainer built anew, as on a
  resume mid-epoch, or one whose class cannot be swapped) the step's data wait is, as a
  fallback, the time from the last hook before on_step_begin (on_step_end, on_log, on_evaluate,
  on_save or on_epoch_begin, whichever came last), which includes that gather;
- collectives: under DDP the callback times the gradient all-reduce (``TrainingRun.watch`` on
  the model: the DDP wrapper is found at its first forward), under FSDP2 the all-gathers and
  reduce-scatters of the modules sharded before training begins, so each rank's compute time
  names a straggler;
- checkpoints: the Trainer calls on_save *after* writing a checkpoint and gives no hook before
  it, so the recorded duration is the time from the last hook before the save (on_step_end,
  on_log, on_evaluate or on_epoch_end, whichever came last) to on_save: the save itself plus the
  Trainer's small bookkeeping in between. It is recorded like TrainingRun.checkpoint(): the
  checkpoint histogram, checkpoint badput and a backdated ``train.checkpoint`` span (child of the
  run's span) with the checkpoint's path and global step;
- the run's ``train.run`` span ends at on_train_end.

Nothing here reads a tensor or synchronizes CUDA. Requires ``transformers``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback

from ..telemetry import Telemetry
from ..train import TrainingRun
from ._common import make_run, record_checkpoint, time_fetches

__all__ = ["GpuobsTrainerCallback"]

_LOGGED = (("loss", "loss"), ("learning_rate", "lr"), ("grad_norm", "grad_norm"))


class GpuobsTrainerCallback(TrainerCallback):
    """transformers TrainerCallback recording steps, micro-steps, samples/tokens, loss, learning
    rate, grad norm and checkpoints into a gpuobs TrainingRun (see the module docstring).

    run: a TrainingRun to record into (default: one created at on_train_begin over the current
    Telemetry, with flops_per_step, peak_flops, dtype (peak FLOP/s looked up for the GPU), report_interval_s
    and sync passed on)."""

    def __init__(self, run: TrainingRun | None = None, *, telemetry: Telemetry | None = None,
                 samples_per_micro_step: int | None = None, flops_per_step: float | None = None,
                 peak_flops: float | None = None, report_interval_s: float = 10.0, sync: bool = False,
                 dtype: str | None = None):
        self._run = run
        self._telemetry = telemetry
        self._run_kwargs = dict(flops_per_step=flops_per_step, peak_flops=peak_flops,
                                report_interval_s=report_interval_s, sync=sync, dtype=dtype)
        self.samples_per_micro_step = samples_per_micro_step
        self._step: Any = None
        self._micro: Any = None
        self._phase: Any = None
        self._micro_batches = 0
        self._tokens_at_begin = 0
        self._mark: tuple[float, int] = (time.perf_counter(), time.time_ns())  # the last hook before a save
        self._fetches = 0  # timed loader fetches since the last on_step_begin
        self._restore_loader: Any = None  # undoes time_fetches on the train dataloader

    @property
    def run(self) -> TrainingRun:
        """The TrainingRun recorded into (created on first use, over the current Telemetry)."""
        if self._run is None:
            self._run = make_run(None, self._telemetry, **self._run_kwargs)
        return self._run

    # ---- hooks --------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Creates the run (over the Telemetry current now), watches the model's DDP or FSDP2 collectives and
        times the fetches of the train dataloader (kwargs["train_dataloader"]) as data wait."""
        run = self.run  # created now, over the Telemetry current at the start of training
        model = kwargs.get("model")
        if model is not None:
            run.watch(model)
        self._untime_loader()  # a loader left timed by a train() that raised
        loader = kwargs.get("train_dataloader")
        if loader is not None:
            self._restore_loader = time_fetches(loader, self._fetched)
        self._fetches = 0
        self._set_mark()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Restarts the data-wait clock: the epoch's first batch is fetched from here."""
        self._set_mark()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Opens the step (whose data wait the timed fetches before it recorded; without any, the time
        since the last hook), and its first micro-step under gradient accumulation; a step left open is
        closed first."""
        self._close_all()  # a step whose on_step_end never came
        if not self._fetches:  # no timed fetch: an untimed loader fetched this step's batches since the mark
            start_perf, start_ns = self._mark
            self.run.add_data_wait(time.perf_counter() - start_perf, start_ns)
        self._fetches = 0
        self._step = self.run.step()
        self._step.__enter__()
        self._micro_batches = 1
        self._tokens_at_begin = _tokens_seen(state)
        if _accumulation(args) > 1:
            self._open_micro()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Closes the micro-step that ended and opens the next (gradient accumulation)."""
        self._close_micro()
        if self._step is not None:
            self._micro_batches += 1
            self._open_micro()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Closes the last micro-step and opens an "optimizer" phase span when tracing."""
        self._close_micro()
        if self._step is not None and self.run.tracing:
            self._phase = self.run.phase("optimizer")
            self._phase.__enter__()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Closes the "optimizer" phase span."""
        self._close_phase()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Sets the step's samples (per micro-step, given or the per-device batch size, times micro-steps)
        and tokens (the Trainer's num_input_tokens_seen since the step began, per rank) and closes the step."""
        step = self._step
        if step is not None:
            per_micro = self.samples_per_micro_step or _batch_size(args)
            step.samples = per_micro * self._micro_batches if per_micro else None
            tokens = _tokens_seen(state) - self._tokens_at_begin
            world = _world_size(args)
            step.tokens = round(tokens / world) if tokens > 0 else None
        self._close_all()
        self._set_mark()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        """Reports the logged loss, learning rate and grad norm (those that are numbers) to the run."""
        if logs:
            values = {key: logs[name] for name, key in _LOGGED if isinstance(logs.get(name), (int, float))}
            if values:
                self.run.report(**values)
        self._set_mark()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Restarts the data-wait clock: evaluation time is not the next batch's wait."""
        self._set_mark()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Closes whatever step, micro-step or phase is open and restarts the data-wait clock."""
        self._close_all()
        self._set_mark()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Records a checkpoint lasting from the last hook to now (the Trainer calls no hook before a save),
        named by the global step and the checkpoint-<step> path under output_dir."""
        start_perf, start_ns = self._mark
        step = getattr(state, "global_step", "")
        path = os.path.join(str(getattr(args, "output_dir", "") or ""), f"checkpoint-{step}")
        record_checkpoint(self.run, time.perf_counter() - start_perf, start_ns, step=step, path=path,
                          timing="since_last_hook")
        self._set_mark()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Closes what is open and the run (its final report)."""
        self._close_all()
        self._untime_loader()
        self.run.close()

    # ---- helpers ------------------------------------------------------------------------------

    def _fetched(self, seconds: float, start_ns: int) -> None:
        """One timed fetch of the train dataloader (TimedIterator): data wait, outside any step here."""
        self._fetches += 1
        self.run.add_data_wait(seconds, start_ns)

    def _untime_loader(self) -> None:
        restore, self._restore_loader = self._restore_loader, None
        if restore is not None:
            restore()

    def _set_mark(self) -> None:
        self._mark = (time.perf_counter(), time.time_ns())

    def _open_micro(self) -> None:
        self._micro = self.run.micro_step()
        self._micro.__enter__()

    def _close_micro(self) -> None:
        micro, self._micro = self._micro, None
        if micro is not None:
            micro.__exit__(None, None, None)

    def _close_phase(self) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            phase.__exit__(None, None, None)

    def _close_all(self) -> None:
        self._close_phase()
        self._close_micro()
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(None, None, None)


def _accumulation(args: Any) -> int:
    try:
        return max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
    except (TypeError, ValueError):
        return 1


def _batch_size(args: Any) -> int | None:
    return getattr(args, "train_batch_size", None) or getattr(args, "per_device_train_batch_size", None)


def _world_size(args: Any) -> int:
    try:
        return max(1, int(getattr(args, "world_size", 1) or 1))
    except (TypeError, ValueError):
        return 1


def _tokens_seen(state: Any) -> int:
    seen = getattr(state, "num_input_tokens_seen", 0) or 0
    return seen if isinstance(seen, int) else 0
