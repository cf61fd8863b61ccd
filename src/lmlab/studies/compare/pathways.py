"""Compare's second half: does a variant keep the question-anchored pathway where its original has it?

The knockout study (`lmlab knockout`, Luo et al.) runs on the original and on each variant, composed through the
registry: its own recipe, probes trained per model, its own run folder under this run's pathways/ folder (reused and
resumed like any run). What compare reads back is each model's knockout claim "E_Q ΔP - control ΔP" (looked up in
the knockout study's declared claims, so a rename there fails here by name) per dataset (blocking attention from
the question's exact tokens moves the truthfulness probe more than blocking as many random question tokens): its
estimate, its interval over S1's replicates (probe splits and control draws) and questions, and its decision.

The claim here (lmlab's): per variant cell and dataset where the original's own claim says "yes", the variant's effect
(the mean over the cell's replicates) keeps at least half of the original's: "yes" when its interval lies below half
the original's effect, "no" when it lies above (less than half is left), open otherwise. Its standard error combines
each replicate model's S1 standard error and the spread between the cell's replicates. Where the original has no such pathway (its claim is not "yes"), there is
nothing to keep: the variant's effect is reported, never decisive.
"""

from __future__ import annotations

import math

import numpy as np

from lmlab.claims import Claim, declared
from lmlab.runs import RunDir

PATHWAY_CLAIM = "E_Q ΔP - control ΔP"  # the knockout study's claim compare reads back (knockout_claim checks it)


def knockout_claim(spec) -> str:
    """The name of the knockout claim compare reads, as the knockout study (`spec`, from the registry) declares it."""
    return declared(spec.claims(), PATHWAY_CLAIM).name


def measure_pathway(lm, model_key: str, cell: str, replicate: int, config, run_dir: RunDir) -> list[dict]:
    """S1 on one model (through the registry), recorded as one unit: a `pathway` row per dataset."""
    done = run_dir.done("pathways")
    if model_key in done:
        return done[model_key]
    from lmlab.studies.registry import get_study
    from lmlab.studies.runner import run_study

    spec = get_study("knockout")
    settings = dict(model=lm.name, profile=config.profile, seed=config.seed, device=config.device, dtype=config.dtype)
    if config.pathway_questions:
        settings["per_dataset"] = config.pathway_questions
    if config.pathway_datasets:
        settings["datasets"] = list(config.pathway_datasets)
    result = run_study(spec, spec.config(**settings), run_dir.path / "pathways", lm=lm)
    name = knockout_claim(spec)
    claims = [c for c in result.verdict.evidence.get("claims", []) if c["name"] == name]
    rows = [{"kind": "pathway", "model_key": model_key, "cell": cell, "replicate": replicate, "dataset": c["group"],
             "estimate": c["estimate"], "se": c["se"], "df": c["df"], "lo": c["low"], "hi": c["high"],
             "decision": c["decision"], "s1_replicates": c["replicates"], "questions": c["n"],
             "s1_status": result.verdict.status, "s1_run": str(result.path)} for c in claims]
    if not rows:  # S1 measured nothing to compare (too few answers of one kind, say): its own sentence, kept
        rows = [{"kind": "pathway_note", "model_key": model_key, "cell": cell, "replicate": replicate,
                 "note": f"lmlab knockout gave no E_Q claim: {result.verdict.summary[:300]}"}]
        run_dir.record("pathways", model_key, rows)
        run_dir.log(f"{model_key} pathways: {rows[0]['note']}")
        return rows
    run_dir.record("pathways", model_key, rows)
    run_dir.log(f"{model_key} pathways: " + ", ".join(f"{r['dataset']} {r['estimate']:+.1f} pp [{r['lo']:+.1f}, "
                                                      f"{r['hi']:+.1f}] ({r['decision']})" for r in rows))
    return rows


def pathway_claims(table, declared_claim) -> list[Claim]:
    """Per variant cell and dataset: the variant keeps the pathway (decisive where the original's S1 claim is "yes",
    reported otherwise), undecided here (the caller decides every claim together)."""
    rows = table[table["kind"] == "pathway"] if "kind" in table else table
    if rows.empty or "model_key" not in rows:
        return []
    original = rows[rows["model_key"] == "original"].set_index("dataset")
    claims = []
    for (cell, dataset), sub in rows[rows["model_key"] != "original"].groupby(["cell", "dataset"], sort=False):
        est = sub["estimate"].to_numpy(float)
        se = sub["se"].to_numpy(float)
        k = len(est)
        between = float(np.var(est, ddof=1) / k) if k > 1 else 0.0
        within = float(np.sum(se ** 2) / k ** 2)
        df = float(max(k - 1, 1)) if k > 1 and between > within else float(np.min(sub["df"]))
        has = dataset in original.index and original.loc[dataset, "decision"] == "yes"
        # DECISION: the bar is half the original's effect, midway between it and none (as the circuit's bar lies
        # midway between a re-measurement and chance): "no" is then a variant whose interval excludes keeping half,
        # not only one whose effect reverses; where the original has none, S1's own reading (below 0) is reported
        bar = declared_claim.make_bar(0.5 * float(original.loc[dataset, "estimate"]) if has else 0.0)
        c = Claim(name="keeps the pathway", estimate=float(est.mean()), se=math.sqrt(between + within), df=df,
                  bar=bar, unit=" pp", group=f"{cell} / {dataset}",
                  method=f"S1's interval per model, over {k} replicate model(s) of the cell",
                  n=int(sub["questions"].iloc[0]), n_unit="questions", replicates=k,
                  replicate_estimates=[float(x) for x in est], se_seed=math.sqrt(between), se_item=math.sqrt(within),
                  reported=not has)
        declared_claim.attach(c)
        if dataset in original.index:
            o = original.loc[dataset]
            c.extra = {"original": float(o["estimate"]), "original_lo": float(o["lo"]), "original_hi": float(o["hi"]),
                       "original_decision": str(o["decision"])}
        else:
            c.extra = {"original": float("nan"), "original_lo": float("nan"), "original_hi": float("nan"),
                       "original_decision": "absent"}
        claims.append(c)
    return claims
