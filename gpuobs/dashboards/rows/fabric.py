"""Node dashboard, row "NVSwitch fabric": each GPU's registration with the fabric manager (fabric family)."""

from __future__ import annotations

from ... import catalog as c
from .. import common as k
from ..common import target
from .selectors import m


def row(L: k.Layout) -> None:
    """Append the 'NVSwitch fabric' row and its panels to the Node dashboard's layout L."""
    L.row("NVSwitch fabric")
    L.add(k.table("Fabric registration", [target(f"{m(c.FABRIC_STATE)} == 1"), target(m(c.FABRIC_STATUS)),
                                          target(m(c.FABRIC_CLIQUE)), target(m(c.FABRIC_HEALTH))], "short",
                  "Each GPU's registration with the NVSwitch fabric manager: state (completed when registered), "
                  "status (0: success) and clique, and the fabric health mask (0: healthy). GPUs without NVSwitch "
                  "fabric show nothing.", merge=True, hide=("cluster", "node", "uuid", "Value #A"),
                  rename={"Value #B": "status", "Value #C": "clique", "Value #D": "health mask"}), 24, 6)
