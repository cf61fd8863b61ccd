"""The only code that touches model internals.

    with intervene(model, Knockout(...), AblateHeads(...), Capture("pattern", "z")) as (ko, ab, cap):
        model(**batch)

Every intervention here is checked in tests against an independent computation on two families.
"""

from lmlab.interventions.attention import IMPL
from lmlab.interventions.core import Intervention, install, installed, intervene, uninstall
from lmlab.interventions.edits import AblateHeads, Knockout, SparseAttention
from lmlab.interventions.hooks import HOOK_POINTS, Capture, EditMLPAct, PatchOutput, PatchResid

__all__ = ["AblateHeads", "Capture", "EditMLPAct", "HOOK_POINTS", "IMPL", "Intervention", "Knockout",
           "PatchOutput", "PatchResid", "SparseAttention", "install", "installed", "intervene", "uninstall"]
