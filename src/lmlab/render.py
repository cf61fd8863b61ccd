"""A verdict in words and in HTML, from what verdict.json stores: the one line that decided it (`headline`, the
report's and the results page's line) and the table a notebook shows (`verdict_html`). On the bottom floor beside
the claims, since a study's Verdict (studies/verdict.py) shows itself in a notebook with it."""

from __future__ import annotations

from lmlab.claims import Bar


def headline(status: str, evidence: dict) -> str:
    """The one line that decided a verdict, from the verdict's `deciding` record (the claim or gate, whose claim it
    is and its bar: claims.deciding); for a verdict stored without one: for "not reproduced" the first claim that failed, for "reproduced" the
    first decisive claim, for "inconclusive" the first failed gate that kept it open, else the first open claim;
    as "name: estimate [low, high] (bar)". "" for a verdict without claims (the study's summary says why)."""
    decided = evidence.get("deciding") or {}
    if decided.get("kind") == "claim":
        who = "the paper's claim" if decided.get("source") == "paper" else "a claim of ours"
        return (f"{decided['line']}; {who}"
                + (f" ({decided['where']})" if decided.get("where") else "")
                + (f"; bar: {decided['bar_note']}" if decided.get("bar_note") else ""))
    if decided.get("kind") == "gate":
        return f"a validity check of ours: {decided['text']}"
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
