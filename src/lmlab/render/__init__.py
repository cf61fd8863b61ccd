"""A verdict in words and in HTML, from what verdict.json stores: the words of every kind of line a judgement
writes (a claim's, a gate's, each note's: `claim_line`, `gate_line`, `note_line`, `judgement_text`), the one line
that decided it (`headline`, the report's and the results page's line) and the table a notebook shows
(`verdict_html`); a study's summary from its parts is `lmlab.render.summary`'s. lmlab.claims decides and keeps its
decisions as data; the words are written here alone. On the bottom floor beside the claims, since a study's Verdict (studies/verdict.py) shows itself in a notebook with it."""

from __future__ import annotations

from typing import Sequence

from lmlab.claims import Bar, Judgement, judge, number


def _num(record: dict, x) -> str:
    """A number of a claim's record as its lines write it (claims.number, at the record's unit, scale and bar)."""
    bar = record.get("bar") if isinstance(record.get("bar"), dict) else {}
    return number(float("nan") if x is None else float(x), record.get("unit", ""),
                  float(record.get("scale", 1.0) or 1.0), bar.get("value"))


def _interval(record: dict) -> str:
    """ "estimate [low, high]" with the unit."""
    unit = record.get("unit", "")
    return (f"{_num(record, record.get('estimate'))}{unit} [{_num(record, record.get('low'))}, "
            f"{_num(record, record.get('high'))}]")


def _label(record: dict) -> str:
    return record["name"] + (f" ({record['group']})" if record.get("group") else "")


def claim_line(c: dict) -> str:
    """A claim (its `as_dict` record) in one line: name and group, whose, estimate and 95% interval, bar, replicates
    x items (and failed ones), then its decision (with why it is open), "not read" or "reported only"."""
    n = int(c.get("replicates", 1))
    failed = int(c.get("failed", 0) or 0)
    body = (f"{_interval(c)} (bar {bar_text(c.get('bar', {}), c.get('unit', ''), float(c.get('scale', 1.0)))}; "
            f"{n} replicate{'s' if n != 1 else ''} x {int(c.get('n', 0) or 0):,} {c.get('n_unit', 'items')}"
            f"{f'; {failed} more failed' if failed else ''})")
    tail = c["decision"] + (f": {c['reason']}" if c["decision"] == "open" and c.get("reason") else "")
    if c.get("set_aside"):
        tail = f"not read: {c['set_aside']}"
    return f"{_label(c)} [{c.get('source', 'lmlab')}]: {body}: {'reported only' if c.get('reported') else tail}"


def gate_line(g: dict) -> str:
    """A gate (its record) in one line: passed or FAILED, why, and for a failed one its remedy."""
    passed = g.get("passed")
    return f"{g['name']}: {'passed' if passed else 'FAILED'}" + (f" ({g['why']})" if g.get("why") else "") + (
        f"; {g['remedy']}" if g.get("remedy") and not passed else "")


def note_line(note: dict) -> str:
    """One of a judgement's notes (claims.judge) in words."""
    kind = note["kind"]
    if kind == "ours_fail":
        return ("a claim of ours fails (" + ", ".join(note["claims"]) + "): it holds the verdict at inconclusive, "
                "and says nothing against the paper, whose own claims do not fail here")
    if kind == "paper_silent":
        return "no claim of the paper's decides in this run: ours alone cannot reproduce it"
    if kind == "unread":
        return ("not read in any group (a gate set it aside): " + ", ".join(note["claims"]) + "; the paper's claims "
                "must each be read to call it reproduced")
    if kind == "to_decide":
        return "to decide: " + "; ".join(f"{need['claim']} needs {need['size']}" for need in note["needs"])
    if kind == "gate_keeps_no":
        return "a claim of the paper's fails, but a gate keeps that from meaning 'not reproduced'"
    if kind == "gate_keeps_yes":
        return "every claim holds, but a gate says the test was too weak to call it reproduced"
    if kind == "bonferroni":
        return f"'no' is read at {100 * note['level']:.1f}% (Bonferroni over {note['m']} claims)"
    raise ValueError(f"a judgement's note of unknown kind {kind!r}")


def records_text(claims: Sequence[dict], failed: Sequence[dict], notes: Sequence[dict]) -> str:
    """A judgement from its records in words: every claim's line, the failed gates' lines, then its notes."""
    parts = [claim_line(c) for c in claims]
    if failed:
        parts.append("gates: " + "; ".join(gate_line(g) for g in failed))
    return ". ".join(parts + [note_line(n) for n in notes])


def judgement_text(j: Judgement) -> str:
    """A judgement in words (`records_text` of its claims, its failed gates and its notes)."""
    return records_text([c.as_dict() for c in j.claims], [g.as_dict() for g in j.gates if not g.passed], j.notes)


def judged(claims: Sequence, gates: Sequence = (), seconds: float = 0.0,
           seconds_per_replicate: float | None = None) -> tuple[str, str]:
    """(status, text): claims.judge, then its words."""
    j = judge(claims, gates, seconds=seconds, seconds_per_replicate=seconds_per_replicate)
    return j.status, judgement_text(j)


def placebo_summary(treatment: str, summary: str) -> str:
    """A placebo run's summary: what replaced the treatment, what its verdict means, then the summary."""
    return (f"PLACEBO ({treatment}): a verdict here is what the claims say where the paper's effect cannot be; "
            f"'reproduced' would mean a claim holds by construction. {summary}")


def decided_line(decided: dict) -> str:
    """What decided a verdict (claims.deciding's record) in one line: a claim's name, numbers, bar and decision; a
    gate's name, why and remedy; a record that carries a line of its own (a study's answer list, or a verdict
    stored before the record was data) gives that line."""
    if decided.get("line"):
        return decided["line"]
    if decided.get("kind") == "claim":
        return (f"{decided['name']}: {_interval(decided)} "
                f"(bar {bar_text(decided['bar'], decided.get('unit', ''), float(decided.get('scale', 1.0)))}; "
                f"{decided['decision']})")
    if decided.get("kind") == "gate":
        if decided.get("text"):
            return decided["text"]
        return f"{decided['name']}: {decided.get('why') or 'failed'}" + (
            f" ({decided['remedy']})" if decided.get("remedy") else "")
    return decided.get("text", "no claim decides")


def decided_text(decided: dict) -> str:
    """`decided_line`, and for a claim whose it is and where it is stated (what `lmlab verdict` prints)."""
    line = decided_line(decided)
    if decided.get("text"):  # a record that carries its words (a study's answer list, or one stored before)
        return decided["text"]
    if decided.get("kind") != "claim":
        return line
    return f"{line}; {decided['source']}: {decided['where']}" + (
        f"; bar: {decided['bar_note']}" if decided.get("bar_note") else "")


def headline(status: str, evidence: dict) -> str:
    """The one line that decided a verdict, from the verdict's `deciding` record (the claim or gate, whose claim it
    is and its bar: claims.deciding); for a verdict stored without one: for "not reproduced" the first claim that failed, for "reproduced" the
    first decisive claim, for "inconclusive" the first failed gate that kept it open, else the first open claim;
    as "name: estimate [low, high] (bar)". "" for a verdict without claims (the study's summary says why)."""
    decided = evidence.get("deciding") or {}
    if decided.get("kind") == "claim":
        who = "the paper's claim" if decided.get("source") == "paper" else "a claim of ours"
        return (f"{decided_line(decided)}; {who}"
                + (f" ({decided['where']})" if decided.get("where") else "")
                + (f"; bar: {decided['bar_note']}" if decided.get("bar_note") else ""))
    if decided.get("kind") == "gate":
        return f"a validity check of ours: {decided_line(decided)}"
    claims = [c for c in evidence.get("claims", []) if not c.get("reported")]
    failed = [g for g in evidence.get("gates", []) if not g.get("passed")]
    if failed and (status == "inconclusive" or not claims):
        gate = next((g for g in failed if g.get("blocks") == "all"), failed[0])
        return f"a validity check of ours failed: {gate['name']}" + (f": {gate['why']}" if gate.get("why") else "")
    wanted = {"not reproduced": "no", "reproduced": "yes"}.get(status, "open")
    claim = next((c for c in claims if c.get("decision") == wanted), claims[0] if claims else None)
    if claim is None:
        return ""
    scale, unit = float(claim.get("scale", 1.0) or 1.0), claim.get("unit", "")

    def num(x):
        return "nan" if x is None or x != x else f"{scale * float(x):+.{2 if abs(scale * float(x)) < 10 else 1}f}"

    bar = claim.get("bar", {})
    name = claim["name"] + (f" ({claim['group']})" if claim.get("group") else "")
    return (f"{name}: {num(claim.get('estimate'))}{unit} [{num(claim.get('low'))}, {num(claim.get('high'))}] "
            f"(bar {bar_text(bar, unit, scale)})")


def bar_text(bar: dict, unit: str, scale: float) -> str:
    """A stored bar (verdict.json's dict) in words; a verdict stored before margins existed has none."""
    try:
        return Bar.stored(bar).text(unit, scale)
    except (KeyError, TypeError, ValueError):
        return f"{bar.get('direction', '')} {scale * float(bar.get('value', 0) or 0):+g}{unit}"


_BADGE = {"reproduced": "#d4f4d4", "not reproduced": "#f8d7d7", "inconclusive": "#fcefc7", "answered": "#d6e6f8"}


def verdict_html(status: str, claim: str, summary: str, evidence: dict) -> str:
    """A verdict as HTML (a notebook shows it): the status and the line that decided it, the claim checked, a table
    of the claims (estimate, 95% interval, bar, decision, whose, replicates x items) and the gates that failed; the
    full summary folded below."""
    from html import escape

    line = headline(status, evidence)
    rows = []
    for c in evidence.get("claims", []):
        scale, unit = float(c.get("scale", 1.0) or 1.0), c.get("unit", "")

        def num(x):
            return "nan" if x is None or x != x else f"{scale * float(x):+.{2 if abs(scale * float(x)) < 10 else 1}f}"

        bar = c.get("bar", {})
        name = c["name"] + (f" ({c['group']})" if c.get("group") else "")
        size = f"{c.get('replicates', 1)} x {int(c.get('n', 0) or 0):,} {c.get('n_unit', 'items')}"
        rows.append("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
            name, f"{num(c.get('estimate'))}{unit} [{num(c.get('low'))}, {num(c.get('high'))}]",
            bar_text(bar, unit, scale),
            "reported" if c.get("reported") else c.get("decision", ""), c.get("source", ""), size)) + "</tr>")
    gates = [g for g in evidence.get("gates", []) if not g.get("passed")]
    gate_rows = "".join(f"<li>{escape(g['name'])} (blocks {escape(str(g.get('blocks', 'all')))}): "
                        f"{escape(g.get('why', ''))}</li>" for g in gates)
    head = (f'<p><span style="background:{_BADGE.get(status, "#ddd")};padding:2px 8px;border-radius:4px;'
            f'font-weight:600">{escape(status)}</span> {escape(line)}</p><p><b>Claim checked:</b> {escape(claim)}</p>')
    table = ('<table><tr><th>claim</th><th>estimate [95% interval]</th><th>bar</th><th>decision</th><th>whose</th>'
             '<th>replicates x items</th></tr>' + "".join(rows) + "</table>") if rows else ""
    failed = f"<p><b>Gates failed:</b></p><ul>{gate_rows}</ul>" if gates else ""
    return (f"<div>{head}{table}{failed}<details><summary>Summary</summary><p>{escape(summary)}</p></details>"
            "</div>")
