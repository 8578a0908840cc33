"""Records of energy and carbon per namespace, team and Slurm job: the power the GPUs a holder has draw
now and, over the weekly window, their energy (joules) and CO2e (grams) at the configured grid
carbon intensity. The holders, the team mapping and the weekly steps are the allocation records'."""

from __future__ import annotations

from .. import catalog as c
from .allocation import NAMESPACE, _by_team, _weekly
from .base import ATTRIBUTION, GPU, GPU_BY, JOB, RANK, Record, Windows, _by, _sum_rate
from .placement import HPC_JOB
from .slowdown import JOB_GPUS
from .training import JOB_TOKENS

# ------------------------------------------------------------------------ energy and carbon per holder
# A GPU's power is the rate of its energy counter (NVML's total energy since the driver loaded, Volta
# and newer): irate, the increase between its last two samples, so that what a holder is charged
# lags the GPU by one scrape interval at most (rate over rate_window would smear a pod's first minutes
# with the idle GPU's power before it). The counter's series change identity with the holder (its
# attribution labels), so the GPU's power is taken per GPU from the series present now, or, in the
# first scrape of a new holder's series (one sample: no irate), from the series it replaced; then
# charged to the holder that has the GPU now (gpuobs_gpu_up with its attribution, as the GPU-hours
# records count it), so a GPU that changes holder within a weekly step counts for each holder's part.
# A GPU without an energy counter (older than Volta, or the field not supported) is charged its power
# usage gauge instead: the board's power, averaged over a second by NVML, sampled once a scrape.
# CO2e: the energy times the grid's carbon intensity per GPU (Thresholds.grid_intensities, first
# match, else grid_intensity_default; gCO2e/kWh), a configured average: neither live nor marginal, and
# embodied carbon (manufacturing) is not counted. Per training job (job_id of the instrumentation), the
# same per-GPU watts are charged through the job -> GPU join (gpuobs.records.slowdown.JOB_GPUS) while
# its ranks are served, and divided by its step and token rates for the energy per step and per token.
KSM_NODE_LABELS = "kube_node_labels"
JOULES_PER_KWH = 3.6e6


def _gpu_power(t: Windows) -> str:
    """Per GPU (GPU_BY and the scrape's other labels, no attribution), watts drawn now."""
    energy = c.ENERGY.exposed_name
    fresh = f"max without ({', '.join(ATTRIBUTION)}) (irate({energy}[{t.rate_window}]) and {energy})"
    replaced = f"max without ({', '.join(ATTRIBUTION)}) (irate({energy}[{t.rate_window}]))"
    fallback = f"max without ({', '.join(ATTRIBUTION)}) ({c.POWER_USAGE.name}) unless on ({GPU_BY}) {energy}"
    return f"{fresh} or on ({GPU_BY}) {replaced} or on ({GPU_BY}) ({fallback})"


GPU_POWER_DRAWN = Record(GPU, "gpuobs_gpu_power_drawn_watts", "irate", _gpu_power)


def grid_intensity(t: Windows) -> str:
    """Per GPU (GPU_BY labels), the grid's carbon intensity in gCO2e/kWh: the first override of
    t.grid_intensities whose regex matches its label (a label_* one through kube_node_labels of its
    node), else the default (`or` keeps the left operand's series)."""
    up = c.GPU_UP.name
    terms = []
    for label, regex, value in t.grid_intensities:
        if label.startswith("label_"):
            gpus = f'{up} and on (cluster, node) {KSM_NODE_LABELS}{{{label}=~"{regex}"}}'
        else:
            gpus = f'{up}{{{label}=~"{regex}"}}'
        terms.append(f"({value:g} * group by ({GPU_BY}) ({gpus}))")
    return " or ".join(terms + [f"({t.grid_intensity_default:g} * group by ({GPU_BY}) ({up}))"])


def _charged(by: tuple[str, ...]) -> str:
    """Per GPU a holder (`by`) has now, with its attribution labels, the watts it draws."""
    return f'({c.GPU_UP.name}{{{by[-1]}!=""}}) * 0 + on ({GPU_BY}) group_left () {GPU_POWER_DRAWN.name}'


def _power(by: tuple[str, ...]) -> Record:
    """Watts the GPUs of each holder (`by`) draw now."""
    return Record(by, "gpuobs_gpus_power_watts", "sum", lambda t: f"sum by ({_by(by)}) ({_charged(by)})")


def _co2e_rate(by: tuple[str, ...]) -> Record:
    """Grams of CO2e per second the GPUs of each holder (`by`) emit now, at each GPU's grid intensity."""
    return Record(by, "gpuobs_gpus_co2e_grams_per_second", "sum",
                  lambda t: f"sum by ({_by(by)}) (({_charged(by)}) * on ({GPU_BY}) group_left () "
                            f"({grid_intensity(t)})) / {JOULES_PER_KWH:g}")


NAMESPACE_POWER, NAMESPACE_CO2E_RATE = _power(NAMESPACE), _co2e_rate(NAMESPACE)
JOB_POWER, JOB_CO2E_RATE = _power(HPC_JOB), _co2e_rate(HPC_JOB)
TEAM_POWER, TEAM_CO2E_RATE = _by_team(NAMESPACE_POWER), _by_team(NAMESPACE_CO2E_RATE)
TOTAL_OF = {"gpuobs_gpus_power_watts": "gpuobs_gpus_energy_joules",
            "gpuobs_gpus_co2e_grams_per_second": "gpuobs_gpus_co2e_grams"}
# per level: (power step, energy over weekly_window in joules, CO2e rate step, CO2e over it in grams)
WEEKLY_ENERGY = {level: tuple(x for now in (power, co2e) for x in _weekly(now, TOTAL_OF[now.metric], unit_s=1))
                 for level, power, co2e in (("namespace", NAMESPACE_POWER, NAMESPACE_CO2E_RATE),
                                            ("team", TEAM_POWER, TEAM_CO2E_RATE),
                                            ("job", JOB_POWER, JOB_CO2E_RATE))}
NAMESPACE_POWER_STEP, NAMESPACE_ENERGY, NAMESPACE_CO2E_STEP, NAMESPACE_CO2E = WEEKLY_ENERGY["namespace"]
TEAM_POWER_STEP, TEAM_ENERGY, TEAM_CO2E_STEP, TEAM_CO2E = WEEKLY_ENERGY["team"]
JOB_POWER_STEP, JOB_ENERGY, JOB_CO2E_STEP, JOB_CO2E = WEEKLY_ENERGY["job"]


# ------------------------------------------------------------------------ energy per training job
def _over_job_gpus(per_gpu: str) -> str:
    """Per job_id, the sum over the GPUs its ranks run on now (JOB_GPUS) of a per-GPU quantity (its
    series taken one per UUID): a GPU two jobs share by UUID is charged to each."""
    return f"sum by (job_id) ({JOB_GPUS.name} * on (uuid) group_left () max by (uuid) ({per_gpu}))"


def _per_second_of(rate: str) -> str:
    """TRAINING_JOB_POWER (J/s) over a per-job rate (per second), where the rate is above 0."""
    return f"{TRAINING_JOB_POWER.name} / on (job_id) ({rate} > 0)"


# Watts the GPUs of each training job draw now (GPU_POWER_DRAWN over JOB_GPUS), the same name as the
# holders' power at level job_id
TRAINING_JOB_POWER = Record(JOB, NAMESPACE_POWER.metric, "sum", lambda t: _over_job_gpus(GPU_POWER_DRAWN.name))
# Grams of CO2e per second the job's GPUs emit now, at each GPU's grid intensity (as the holders')
TRAINING_JOB_CO2E_RATE = Record(
    JOB, NAMESPACE_CO2E_RATE.metric, "sum",
    lambda t: f"{_over_job_gpus(f'{GPU_POWER_DRAWN.name} * on ({GPU_BY}) group_left () ({grid_intensity(t)})')}"
              f" / {JOULES_PER_KWH:g}")
# Joules per optimizer step: the job's watts over its step rate (the mean of its ranks' rates over
# rate_window: every rank of a synchronous job runs every step); none while it makes no steps
TRAINING_JOB_ENERGY_PER_STEP = Record(
    JOB, "gpuobs_training_energy_joules", "per_step",
    lambda t: _per_second_of(f"avg by (job_id) ({_sum_rate(RANK, c.STEPS.exposed_name, t)})"))
# Joules per token trained: the job's watts over its tokens per second (JOB_TOKENS, all ranks')
TRAINING_JOB_ENERGY_PER_TOKEN = Record(JOB, "gpuobs_training_energy_joules", "per_token",
                                       lambda t: _per_second_of(JOB_TOKENS.name))
