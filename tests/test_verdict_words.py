"""The words of a verdict, pinned: every kind of line lmlab.render writes from a judgement's data (a claim's, a
gate's, each note's, what decided, the headline, a placebo's summary), and the judgement itself read as data."""

import pytest

from lmlab.claims import Bar, Claim, Gate, deciding, evidence, judge
from lmlab.render import (claim_line, decided_line, decided_text, gate_line, headline, judgement_text, note_line,
                          placebo_summary)


def _claim(est, se=0.01, **kw):
    kw.setdefault("bar", Bar(">=", 0.0, 0.0))
    return Claim(name=kw.pop("name", "gain"), estimate=est, se=se, df=float("inf"), **kw)


def _decided(c: Claim) -> Claim:
    c.decide()
    return c


def test_each_kind_of_claim_line():
    paper = _decided(_claim(0.05, unit=" pp", scale=100, group="geo", n=300, replicates=3, source="paper"))
    assert claim_line(paper.as_dict()) == ("gain (geo) [paper]: +5.0 pp [+3.0, +7.0] (bar >= 0 pp, interval above 0; "
                                           "3 replicates x 300 items): yes")
    open_ = _decided(_claim(0.005, n=300, replicates=1))
    assert claim_line(open_.as_dict()) == ("gain [lmlab]: +0.01 [-0.01, +0.02] (bar >= 0, interval above 0; "
                                           "1 replicate x 300 items): open: the interval includes the bar")
    reported = _decided(_claim(0.5, reported=True, n=10, replicates=2))
    assert claim_line(reported.as_dict()).endswith("(bar >= 0, interval above 0; 2 replicates x 10 items): "
                                                   "reported only")
    failed = _claim(0.05, n=100, replicates=6, failed=1)
    failed.decision = "yes"
    assert claim_line(failed.as_dict()).endswith("; 6 replicates x 100 items; 1 more failed): yes")
    aside = _claim(0.05, n=100, replicates=2, set_aside="geo: probes")
    assert claim_line(aside.as_dict()).endswith("2 replicates x 100 items): not read: geo: probes")
    margin = _decided(_claim(-0.5, bar=Bar("<=", 0.0, None, 0.1), unit="x", n=20, replicates=4))
    assert claim_line(margin.as_dict()) == ("gain [lmlab]: -0.50x [-0.52, -0.48] (bar <= 0x; 'no' only above +0.1x; "
                                            "4 replicates x 20 items): yes")


def test_each_kind_of_gate_and_note_line():
    assert gate_line(Gate("converged", True, why="loss flat", remedy="more").as_dict()) == "converged: passed (loss flat)"
    assert gate_line(Gate("converged", False, why="loss falling", remedy="more --steps").as_dict()) == \
        "converged: FAILED (loss falling); more --steps"
    assert gate_line(Gate("converged", False).as_dict()) == "converged: FAILED"
    words = {
        "ours_fail": ({"claims": ["a (geo)", "b"]}, "a claim of ours fails (a (geo), b): it holds the verdict at "
                      "inconclusive, and says nothing against the paper, whose own claims do not fail here"),
        "paper_silent": ({}, "no claim of the paper's decides in this run: ours alone cannot reproduce it"),
        "unread": ({"claims": ["flips"]}, "not read in any group (a gate set it aside): flips; the paper's claims "
                   "must each be read to call it reproduced"),
        "to_decide": ({"needs": [{"claim": "gain", "size": "about 5 seeds"}, {"claim": "flips (geo)",
                                                                              "size": "more items"}]},
                      "to decide: gain needs about 5 seeds; flips (geo) needs more items"),
        "gate_keeps_no": ({}, "a claim of the paper's fails, but a gate keeps that from meaning 'not reproduced'"),
        "gate_keeps_yes": ({}, "every claim holds, but a gate says the test was too weak to call it reproduced"),
        "bonferroni": ({"m": 4, "level": 1 - 0.05 / 4}, "'no' is read at 98.8% (Bonferroni over 4 claims)"),
    }
    for kind, (values, line) in words.items():
        assert note_line({"kind": kind, **values}) == line, kind
    with pytest.raises(ValueError, match="unknown kind"):
        note_line({"kind": "a new kind nobody wrote words for"})


def test_what_decided_and_the_headline_in_words():
    c = _decided(_claim(0.05, unit=" pp", scale=100, group="geo", n=300, replicates=3, source="paper",
                        where="its Table 2"))
    d = deciding([c])
    assert d["kind"] == "claim" and d["bar"] == {"direction": ">=", "value": 0.0, "null": 0.0, "margin": None}
    assert decided_line(d) == "gain (geo): +5.0 pp [+3.0, +7.0] (bar >= 0 pp, interval above 0; yes)"
    assert decided_text(d) == decided_line(d) + "; paper: its Table 2"
    assert headline("reproduced", {"deciding": d}) == decided_line(d) + "; the paper's claim (its Table 2)"
    g = deciding([c], [Gate("teacher learned", False, why="at chance", remedy="more epochs")])
    assert g["kind"] == "gate" and decided_line(g) == decided_text(g) == "teacher learned: at chance (more epochs)"
    assert headline("inconclusive", {"deciding": g}) == "a validity check of ours: teacher learned: at chance (more epochs)"
    assert decided_text(deciding([])) == "no claim decides"
    # a verdict stored before what decided was data carries its words, and they are read as stored
    stored = {"kind": "claim", "source": "lmlab", "where": "ours", "line": "x: +1 [0, 2] (bar >= 0; yes)",
              "text": "x: +1 [0, 2] (bar >= 0; yes); lmlab: ours"}
    assert headline("inconclusive", {"deciding": stored}) == "x: +1 [0, 2] (bar >= 0; yes); a claim of ours (ours)"
    assert decided_text(stored) == stored["text"]
    assert placebo_summary("constant codes", "S.") == (
        "PLACEBO (constant codes): a verdict here is what the claims say where the paper's effect cannot be; "
        "'reproduced' would mean a claim holds by construction. S.")


def test_a_judgement_is_data_and_its_words_come_from_that_data():
    """judge decides and keeps notes as data; verdict.json stores them; the summary is their words."""
    paper_open = _claim(0.004, n=300, replicates=3, se_seed=0.01, se_item=0.005, source="paper")
    ours_no = _claim(-0.5, name="control", n=300, replicates=3, source="lmlab")
    j = judge([paper_open, ours_no], [Gate("converged", False, why="falling", blocks="yes")], seconds=60.0)
    assert j.status == "inconclusive"
    assert [n["kind"] for n in j.notes] == ["ours_fail", "to_decide", "bonferroni"]
    assert j.notes[0]["claims"] == ["control"] and j.notes[1]["needs"][0]["claim"] == "gain"
    assert j.notes[2] == {"kind": "bonferroni", "m": 2, "level": pytest.approx(0.975)}
    ev = evidence(j.claims, j.gates, judgement=j)
    assert ev["notes"] == j.notes and [c["decision"] for c in ev["claims"]] == ["open", "no"]
    text = judgement_text(j)
    parts = [claim_line(c) for c in ev["claims"]] + ["gates: " + gate_line(ev["gates"][0])]
    assert text == ". ".join(parts + [note_line(n) for n in ev["notes"]])
