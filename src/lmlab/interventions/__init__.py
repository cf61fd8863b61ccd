"""The only code that touches model internals.

    with intervene(model, Knockout(...), AblateHeads(...), Capture("pattern", "z")) as (ko, ab, cap):
        model(**batch)

Every intervention here is checked in tests against an independent computation on two families
(tests/test_interventions.py), and the core ones on a tiny instance of every architecture (lmlab.conformance, `lmlab models --architectures --check TYPE`).
"""

from lmlab.interventions.attention import IMPL
from lmlab.interventions.core import Intervention, install, installed, intervene, uninstall
from lmlab.interventions.edits import AblateHeads, Knockout, PatchHeadRows, SparseAttention, check_knockout
from lmlab.interventions.hooks import (HOOK_POINTS, Capture, EditMLPAct, PatchOutput, PatchResid, RetireRows,
                                      StartAt)

__all__ = ["AblateHeads", "Capture", "check_knockout", "EditMLPAct", "HOOK_POINTS", "IMPL", "Intervention", "Knockout",
           "PatchHeadRows", "PatchOutput", "PatchResid", "RetireRows", "SparseAttention", "StartAt", "install", "installed", "intervene", "uninstall"]


def _restore_sparse_attention(loaded) -> None:
    """A folder saved with `save_model(..., sparse_attention=True)` runs with the deterministic edge gate."""
    install(loaded, SparseAttention(sample=False))


def _register_extras() -> None:
    from lmlab.models.load import EXTRA_HANDLERS

    EXTRA_HANDLERS["sparse_attention"] = _restore_sparse_attention


_register_extras()
