"""Whether a training had converged, from its recorded loss: the heuristic every study's convergence gate reads."""

from __future__ import annotations

import numpy as np


def still_falling(q3: float, q4: float, relative: float = 0.10, absolute: float = 0.0) -> bool:
    """Whether a training had not converged: its loss's last-quarter mean `q4` still fell below the third quarter's
    `q3` by more than `relative` of it and by more than `absolute` (a heuristic; every study's convergence gate
    reads its training losses this way). Unknown quarters (NaN) count as converged."""
    if not (np.isfinite(q3) and np.isfinite(q4)):
        return False
    drop = float(q3) - float(q4)
    return drop > relative * abs(float(q3)) and drop > absolute
