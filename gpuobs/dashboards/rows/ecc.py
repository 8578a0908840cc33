"""Node dashboard, row "ECC and memory repairs": ECC errors, remapped rows, retired pages (ecc family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import rate, target
from .selectors import BAD, GPU, m

VOLATILE = 'counter_type="volatile"'  # counts since the last reset (aggregate: lifetime)


def row(L: k.Layout) -> None:
    """Append the 'ECC and memory repairs' row and its panels to the Node dashboard's layout L."""
    L.row("ECC and memory repairs")
    L.add(k.timeseries("ECC errors", [target(
        f"sum by (gpu, error_type) ({rate(m(c.ECC_ERRORS, VOLATILE))})", GPU + " {{error_type}}")], "cps",
        "Corrected and uncorrected ECC errors per second (volatile counters).", min=0), 8, 8)
    L.add(k.table("ECC counters and mode", [target(m(c.ECC_ERRORS)), target(m(c.ECC_MODE))], "short",
                  "ECC error counts (volatile: since the last reset, aggregate: lifetime) and whether ECC is on.",
                  hide=("cluster", "node"), rename={"Value #A": "errors", "Value #B": "ECC enabled"}), 8, 8)
    L.add(k.timeseries("Remapped rows and retired pages", [
        target(m(c.REMAPPED_ROWS), GPU + " remapped {{error_type}}"),
        target(m(c.RETIRED_PAGES), GPU + " retired {{cause}}")], "short",
        "DRAM rows remapped (Ampere and later) and pages retired (earlier GPUs) after ECC errors.", min=0), 8, 8)
    L.add(k.state_timeline("Repairs pending or failed", [
        target(m(c.REMAP_PENDING), GPU + " remap pending"), target(m(c.REMAP_FAILURE), GPU + " remap failure"),
        target(m(c.RETIRED_PAGES_PENDING), GPU + " retirement pending")], "short",
        "A pending remap or retirement takes effect at the next GPU reset; a failed remap needs service.",
        thresholds=BAD), 12, 6)
    L.add(k.timeseries("Row-remap bank availability", [target(m(c.REMAP_BANKS), GPU + " {{availability}}")],
                       "short", "Memory banks by how many spare rows they have left (max to none): banks moving "
                       "toward low and none run out of repairs.", min=0, stack=True), 12, 6)
    L.add(k.timeseries("ECC errors by location", [target(
        f"sum by (gpu, location, error_type) ({rate(m(c.ECC_LOCATION_ERRORS, VOLATILE))})",
        GPU + " {{location}} {{error_type}}")], "cps",
        "ECC errors per second in on-chip SRAM and in device memory (DRAM), volatile counters.", min=0), 24, 7)
