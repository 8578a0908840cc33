"""Node dashboard, row "Jobs and models on this node": the training jobs and inference models with series here, linked
to their dashboards."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import sel, target
from .selectors import C, N


def row(L: k.Layout) -> None:
    """Append the 'Jobs and models on this node' row and its panels to the Node dashboard's layout L."""
    L.row("Jobs and models on this node")
    L.add(k.table("Training jobs", [target(f"count by (job_id) ({sel(c.STEPS, C, N)})")], "short",
                  "Training jobs with ranks on this node; click for the job's dashboard.",
                  rename={"Value": "ranks here"},
                  links=[k.data_link("Training job ${__data.fields.job_id}", "training",
                                     job_id="${__data.fields.job_id}")]), 12, 5)
    L.add(k.table("Inference models", [target(
        f"count by (gen_ai_request_model) ({sel(c.REQUEST_DURATION, C, N, suffix='count')})")], "short",
        "Models served on this node; click for the inference dashboard.", rename={"Value": "series"},
        links=[k.data_link("Inference: ${__data.fields.gen_ai_request_model}", "inference",
                           model="${__data.fields.gen_ai_request_model}")]), 12, 5)
