"""Alerts of the ECC and memory family: ECC errors, DRAM row remapping, driver ECC messages."""

from __future__ import annotations

from functools import partial

from ... import catalog as c
from ... import logpatterns as lp
from ... import records
from ..common import DEGRADING, GPU, LINE, Alert, Thresholds, _gpu_lines, _rising


def memory(t: Thresholds) -> list[Alert]:
    """ECC errors and DRAM row remapping."""
    alert = partial(Alert, family="memory", scope="gpu")
    ecc, w = c.ECC_ERRORS.exposed_name, t.rate_window
    return [
        alert(name="GpuEccUncorrectable", expr=f"increase({ecc}{records.UNCORRECTED}[{w}]) > 0", for_="0s",
              severity="critical", summary="Uncorrectable ECC errors on a GPU.",
              description=f"{GPU} had {{{{ $value | humanize }}}} uncorrectable ECC errors in the last {w}.",
              keep_firing_for=t.keep_firing),
        alert(name="GpuEccCorrectedRate",
              expr=f'rate({ecc}{{error_type="corrected",counter_type="volatile"}}[{t.long_window}])'
                   f" > {t.ecc_corrected_per_s:g}",
              for_=t.for_medium, severity="warning", summary="High rate of corrected ECC errors on a GPU.",
              description=f"{GPU} corrects {{{{ $value | printf \"%.3g\" }}}} ECC errors per second."),
        alert(name="GpuRowRemapPending", expr=f"{c.REMAP_PENDING.name} == 1", for_=t.for_short, severity="warning",
              summary="A GPU has a row remap pending: it needs a reset.",
              description=f"{GPU} has a DRAM row remap pending; it takes effect at the next GPU reset."),
        alert(name="GpuRowRemapFailure", expr=f"{c.REMAP_FAILURE.name} == 1", for_=t.for_now, severity="critical",
              summary="A GPU failed to remap a row: it needs service.",
              description=f"{GPU} could not remap a failing DRAM row: take it out of service."),
        alert(name="GpuEccCorrectedRising",
              expr=_rising(records.GPU_ECC_CORRECTED_RATE, t.ecc_corrected_trend_per_s, t), for_=t.for_medium,
              severity="warning", summary="Corrected ECC errors on a GPU are rising. " + DEGRADING,
              description=f"{GPU} corrects {{{{ $value | printf \"%.3g\" }}}} ECC errors per second over the last "
                          f"{t.trend_window}, over {t.trend_factor:g}x its rate {t.trend_baseline} earlier."),
        alert(name="GpuRowRemapBanksDepleting",
              expr=f"{records.GPU_REMAP_BANKS_LOW.name} - min_over_time({records.GPU_REMAP_BANKS_LOW.name}"
                   f"[{t.trend_baseline}]) >= {t.remap_banks_rise}",
              for_=t.for_short, severity="warning",
              summary="A GPU's memory banks are running out of spare rows. " + DEGRADING,
              description=f"{{{{ $value }}}} more memory banks of {GPU} have few or no spare rows left than "
                          f"at their fewest in the last {t.trend_baseline}."),
        alert(name=lp.BY_NAME["ecc_error"].alert, expr=_gpu_lines("ecc_error", t), for_="0s", severity="critical",
              summary="The logs report an uncorrectable ECC error or a failed row remap.",
              description=f"The logs of {LINE} report uncorrectable ECC or row-remap errors in the last "
                          f"{t.rate_window}.",
              keep_firing_for=t.keep_firing),
    ]
