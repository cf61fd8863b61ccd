"""A study's verdict: its status, the claim, the summary and the numbers behind them (and a placebo run's, said to be
the placebo's)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, model_validator

# "answered": a run of lmlab's own question, which no paper claims (compare), that answered at least one of its
# comparisons; it never stands for a paper's claim, so it is neither "reproduced" nor "not reproduced"
Status = Literal["reproduced", "not reproduced", "inconclusive", "answered"]


class Verdict(BaseModel):
    """The paper's qualitative claim, checked on the table, with the numbers behind the answer. `parts` is what the
    summary says, as data (records whose "kind" names them: lmlab.render.summary writes each in words); a verdict
    made from its parts has its summary written from them, one stored before parts were kept has its summary only."""

    status: Status
    claim: str
    summary: str = ""
    parts: list[dict[str, Any]] = []
    evidence: dict[str, Any] = {}

    @model_validator(mode="after")
    def _written(self) -> "Verdict":
        if self.parts and not self.summary:
            from lmlab.render.summary import summary_text

            self.summary = summary_text(self.parts)
        return self

    def _repr_html_(self) -> str:
        from lmlab.render import verdict_html

        return verdict_html(self.status, self.claim, self.summary, self.evidence)


def placebo_verdict(verdict: Verdict, treatment: str) -> Verdict:
    """A placebo run's verdict, as its claims judged it (never overridden: a placebo that comes out "reproduced" is a
    finding about the claims), said to be the placebo's: the summary opens with what replaced the treatment and the
    evidence carries it, so the report sets it beside the study's own verdict."""
    from lmlab.render import placebo_summary

    parts = [{"kind": "placebo", "treatment": treatment}, *verdict.parts] if verdict.parts else []
    return verdict.model_copy(update={"summary": placebo_summary(treatment, verdict.summary), "parts": parts,
                                      "evidence": {**verdict.evidence, "placebo": treatment}})
