"""A GECO-style Lagrange multiplier (Rezende & Viola, 2018) for "minimise A subject to B <= tau".

    loss = objective + lambda * (B - tau)
    after each step: ema <- a * ema + (1 - a) * (B - tau);  lambda <- clip(lambda * exp(rate * ema))

A step may bring its own tau (a bound measured on the same batch, `loss(..., tau=)` and `update(..., tau=)`):
the constraint then compares like with like and batch-to-batch noise in B largely cancels.
The multiplier grows while the moving average of the constraint is violated (B above tau) and shrinks while it
holds, so the objective is pushed only as far as the constraint allows. The multiplicative update keeps lambda
positive. `clip` bounds the violation one update acts on: at the start of sparse post-training the sampled gate
drops edges the model needs and the CE jumps far above a small slack, and an unbounded update then multiplies lambda
by e^10 in twenty steps, after which the edge term no longer moves anything; with the violation clipped to twice the
slack lambda still grows steadily while the constraint is violated. `trace` keeps (B, tau, ema, lambda) per step;
`state_dict` / `load_state_dict` carry it with the multiplier, so a resumed run continues exactly and its trace is
whole.

`sized_rate(steps, scale)`: a rate for a step budget, so that a violation of `scale` held for half the
budget moves lambda by a factor of 10 (short runs need a fast multiplier, long ones a calm one). On a
scripted convex problem (tests) a rate 4x faster than this oscillates without settling.
"""

from __future__ import annotations

import math

import torch


class GECO:
    def __init__(self, tau: float, rate: float = 1.0, alpha: float = 0.9, initial: float = 1.0,
                 bounds: tuple[float, float] = (1e-3, 1e4), clip: float | None = None):
        self.tau, self.rate, self.alpha, self.bounds = float(tau), float(rate), float(alpha), bounds
        self.clip = clip  # the largest |moving average| one update acts on (None: no limit)
        self.multiplier = float(initial)
        self.ema: float | None = None
        self.steps = 0
        self.trace: list[tuple[float, float, float, float]] = []  # (constrained value, its bound, ema, lambda)

    def loss(self, objective: torch.Tensor, constrained: torch.Tensor, tau: float | None = None) -> torch.Tensor:
        """The Lagrangian with the current multiplier; call `update` once per optimizer step. `tau`: this step's
        bound, where it is measured on the step's own batch (default: the fixed one)."""
        return objective + self.multiplier * (constrained - (self.tau if tau is None else tau))

    def update(self, constrained: float, tau: float | None = None) -> float:
        bound = self.tau if tau is None else float(tau)
        violation = float(constrained) - bound
        self.ema = violation if self.ema is None else self.alpha * self.ema + (1 - self.alpha) * violation
        low, high = self.bounds
        push = self.ema if self.clip is None else max(-self.clip, min(self.clip, self.ema))
        self.multiplier = min(max(self.multiplier * math.exp(self.rate * push), low), high)
        self.steps += 1
        self.trace.append((float(constrained), bound, self.ema, self.multiplier))
        return self.multiplier

    @property
    def holds(self) -> bool:
        """The moving average of the constraint is satisfied (False before the first update)."""
        return self.ema is not None and self.ema <= 0

    def state_dict(self) -> dict:
        return {"tau": self.tau, "multiplier": self.multiplier, "ema": self.ema, "steps": self.steps,
                "trace": [list(t) for t in self.trace]}

    def load_state_dict(self, state: dict) -> None:
        self.tau, self.multiplier, self.ema, self.steps = (state["tau"], state["multiplier"], state["ema"],
                                                           state["steps"])
        self.trace = [tuple(t) for t in state.get("trace", [])]


def sized_rate(steps: int, scale: float) -> float:
    """ln(10) / (scale * steps / 2): `scale` of violation held over half of `steps` multiplies lambda by 10."""
    return math.log(10.0) / (max(scale, 1e-6) * max(steps / 2, 1.0))
