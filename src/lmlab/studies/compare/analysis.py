"""Compare's analysis: does each variant keep the original's circuit on each task?

Claims (lmlab's own: no paper claims this; declared in CLAIMS below):
- keeps the circuit (decisive): is the variant's circuit as close to the original's as a second measurement of the
  original itself is? A circuit is a model's top-k heads by |mean attribution| over prompt pairs, k the heads the
  original needs for 0.9 of the effect (at least `min_k`, at most half the heads). DECISION, like for like: every
  quantity compares rankings made on two disjoint halves of the prompt pairs, on the same random half-splits:
    V = the variant's top-k on one half against the original's top-k on the other half (Jaccard, both ways, mean
        over the splits): how close the variant's circuit is to the original's;
    R = the original's top-k on one half against its top-k on the other half, the same splits: how close two
        measurements of the original are ("two equally good models are the baseline, not 1.0");
    C = chance: the expected Jaccard of two random k-sets of the model's heads, k / (2N - k).
  The statistic is D = V - (R + C) / 2, the variant's overlap past the midpoint between a re-measurement of the
  original and an unrelated ranking; the claim holds for D >= 0 (declared: the bar is 0, fixed; R and C are in the
  statistic, not in the bar). The interval resamples the prompt pairs (each resample re-ranks both models on both
  halves of every split, so R's uncertainty is in D's, paired with V's) and the replicates, each on its own draw of
  prompt pairs (a t interval over both levels, lmlab.claims; see "Replicates are draws" below). "yes" (keeps it): D's interval above 0, "no": below 0, each read at
  the family-wise level (Bonferroni over the run's comparisons: each comparison is an answer of its own, so a "keeps"
  is guarded as a "does not keep" is); open otherwise, with the reason.
  Why halves on both sides: an overlap of rankings made on all the prompt pairs shares the prompts' own noise (both
  models see the same prompts), while a re-measurement on other prompts does not; a bar from R on halves set against
  an overlap on the whole set sits low, and a variant with half its circuit replaced could pass it. On the same
  splits, a variant identical to the original has V = R exactly.
  The original's own circuit must replicate for any comparison to mean something: where R's interval is not clear
  of chance, every comparison on that task is held open, and says so.
- rank correlation (reported): Spearman's rho of the two models' mean attribution over the union of their top-k heads.
- task metric change (reported): the variant's clean metric minus the original's, paired prompt by prompt.
- keeps the pathway (with --pathways; pathways.py): S1's knockout effect on the variant where the original has it.
Per claim, DECISION: a model whose attribution does not track activation patching on its top heads (Spearman below
`min_verify`; read on several draws, the original's mean over its draws and the variant's over its replicates) or a
task with no effect to explain on any draw (clean metric = every head patched; a replicate on a draw without one is
left out) holds that task's claim open: a ranking that does not measure the heads cannot be compared.

Controls and the placebo (recipe.py, placebo.py): `same` (V = R: D = (R - C) / 2 > 0, keeps); `swap`, the original
with its circuit's heads moved to other heads of their layers in the weights (a working model, its answers unchanged,
its circuit elsewhere: must not keep); `swap:half` (half of them moved: a variant that keeps half its circuit reads
below the midpoint where the measurement is clean, its Jaccard 1/3 of R, and near it at most where only the strongest
heads replicate, so it must never come out "keeps"); `ablate` (its circuit zeroed). The controls' heads are ranked on
prompt pairs other than the judged ones, so none acts on exactly the heads it is then read at. `--placebo` runs `swap`
and `swap:half` alone. The full-prompt Jaccard of the two top-k sets is kept beside the claim (`jaccard`), as a
description.

Replicates are draws (lmlab.compare.measure): replicate r of a cell is read on the run's r-th draw of prompt pairs,
against the original measured on that same draw, at that draw's k, R and C. So every source of variation that
changes with the run's seed (the prompt pairs, and with them k and R) varies between the replicates inside a run,
and the interval carries it: D per replicate, then a t interval over the replicates with the prompt pairs' part
from each draw's resamples, counted once (the replicates' spread beyond what their prompt pairs explain;
`claims.interval_parts` with `shared=False`). A variant that is one model (a width made in the run, a folder,
the controls) is measured on every draw; a cell of trained students pairs student r with draw r. A variant that
keeps in one replicate and not in the others reads a spread between replicates far beyond its prompt pairs', so the
interval widens on few degrees of freedom and the cell stays open: the honest reading of an answer that does not
replicate. With one draw (--seeds 1, or a file of prompt pairs) every replicate shares the prompt pairs and the two
parts add, as before. Where few replicates set the width, the open claim says so, with its degrees of freedom and
quantiles; more replicates narrow it.

The verdict's status follows lmlab's rule of whose claim decides what: no paper's claim is checked here, so it is
never "reproduced" nor "not reproduced". It is "answered" where at least one comparison answered (and no gate blocks
every decision), its first line counting the comparisons that keep, do not and are open, and the fewest bits that
keep per method and task; "inconclusive" where none answered. The answers are per variant and task, in the
verdict's summary, the `comparison` table and the figure.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from lmlab.circuit_overlap import (SPLITS, chance, half_splits, jaccard, scored_heads, self_overlap,
                                   spearman_union, split_overlaps, top_masks)
from lmlab.claims import Declared, declared, evidence, judge
from lmlab.render.summary import ANSWER, part_text
from lmlab.resampling import Resampler
from lmlab.studies.figures import canvas, finish
from lmlab.studies.verdict import Verdict
from lmlab.studies.compare.methods import width_of_name
from lmlab.studies.compare.config import circuit_k as config_circuit_k

WHY = ("no paper claims this: lmlab's own question, whether compression keeps the mechanism and not only the accuracy "
       "(compression papers report accuracy and perplexity; circuit papers study one model at a time)")
CLAIMS = [
    Declared("keeps the circuit", "D = V - (R + C) / 2 on the same random half-splits of the prompt pairs: V the "
             "Jaccard overlap of the variant's top-k heads on one half with the original's on the other (both ways), R "
             "the original's top-k on one half against its own on the other, C chance, k / (2N - k) (k: the heads the "
             "original needs for 0.9 of the effect, at least min_k, at most half the heads); interval over prompt "
             "pairs (R re-measured on every draw) and replicates", ">=", 0.0, "lmlab", WHY),
    Declared("rank correlation", "Spearman's rho of mean attribution over the union of both top-k sets", ">=", 0.0,
             "lmlab", WHY, decisive=False),
    Declared("task metric change", "the variant's clean task metric minus the original's, paired by prompt",
             ">=", 0.0, "lmlab", WHY, decisive=False),
    Declared("keeps the pathway", "the variant's E_Q ΔP - control ΔP (lmlab knockout's effect of blocking the "
             "question's exact tokens against random ones), mean over the cell's replicate models",
             "<=", None, "lmlab",
             "no paper claims this: whether a compressed model still routes truthfulness through the question-anchored "
             "pathway Luo et al. find in full-precision models (with --pathways)", unit=" pp",
             rule="half the original's effect (midway between it and none), decisive where the original's own "
                  "effect holds; 0 (reported) where it does not"),
]

# the tables the recipe hands to the analysis, and the columns each always carries
COLUMNS = {
    "model": ("model_key", "cell", "replicate", "draw", "task", "model_name", "clean_metric", "corrupted_metric", "metric",
              "n_prompts", "heads_needed", "total_heads", "has_effect", "verify_rho", "verify_heads", "n_layers",
              "n_heads"),  # (and, on the induction task, induction_score: a column of NaN only is not in the table)
    "attribution": ("model_key", "cell", "replicate", "task", "idx", "scores"),
    "per_prompt": ("model_key", "cell", "replicate", "task", "n_heads", "values"),
    "verify_component": ("model_key", "task", "layer", "index", "attribution", "activation"),
    "variant": ("cell", "replicate", "model_key", "source", "variant_kind", "made"),  # (and, for a variant at a bit
    # width, method and bits: NaN-only columns are not in the table)
    "made": ("cell", "method", "bits", "folder", "perplexity", "original_perplexity", "n_text", "origin"),  # (and,
    # for a width made in the run, its replicate: a calibrated method's one per replicate)
    "curve": ("model_key", "cell", "replicate", "task", "n_heads", "value"),
    "overlap": ("cell", "replicate", "task", "k", "split_jaccard", "jaccard", "spearman"),
    "reference": ("task", "k", "value", "lo", "hi", "chance"),
    "replicate_overlap": ("cell", "task", "k", "value", "lo", "hi"),
    "heads": ("cell", "task", "k", "kept", "lost", "new"),
    "comparison": ("cell", "task", "k", "estimate", "lo", "hi", "bar", "overlap", "self_overlap", "self_lo", "self_hi",
                   "chance", "midpoint", "relative", "jaccard", "replicates", "df", "decision", "reason", "to_decide",
                   "spearman", "metric_change", "metric_lo", "metric_hi", "original_heads", "variant_heads",
                   # (and on the induction task original_induction, variant_induction: NaN-only columns are dropped)
                   "clean_metric", "corrupted_metric", "task_lost"),
    "selection": ("task", "idx", "other_pairs", "scores"),
    "placebo": ("cell", "task", "k", "moved", "stuck", "heads", "stuck_heads", "layers_permuted", "kv_groups",
                "chosen_on_other_pairs"),
    "pathway": ("model_key", "cell", "replicate", "dataset", "estimate", "se", "df", "lo", "hi", "decision",
                "s1_replicates", "questions", "s1_status", "s1_run"),
    "pathway_note": ("model_key", "cell", "replicate", "note"),
    "pathway_comparison": ("cell", "dataset", "estimate", "lo", "hi", "decision", "replicates", "original",
                           "original_lo", "original_hi", "original_decision", "decisive", "reason"),
}

# how far from chance toward a re-measurement of the original a variant's overlap must reach. DECISION: midway. A
# higher mark (three quarters) would put a variant that keeps half its circuit clearly below in every noise regime, but
# the Jaccard is convex in the heads shared: a clean measurement of a variant that keeps 5 of 6 heads reads 0.71, so
# such a mark would call it "does not keep"
KEEP = 0.5
BOOT_SPLITS = 32  # half-splits for each resample of the prompt pairs (the claim's interval)
K_MAX = 30  # the overlap curves run k = 1 .. this (or to the claim's k, where larger)


# --- reading the tables -----------------------------------------------------------------------------------------

def attributions(table: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """(model_key, task) -> (prompt pairs, layers x heads) attribution scores, prompts in order."""
    rows = table[table["kind"] == "attribution"] if "kind" in table else table
    out = {}
    for (key, task), sub in rows.groupby(["model_key", "task"], sort=False):
        sub = sub.sort_values("idx")
        out[(str(key), str(task))] = np.array([json.loads(s) for s in sub["scores"]], dtype=float)
    return out


def clean_metrics(table: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """(model_key, task) -> each prompt pair's clean metric (the curve's point with every head kept)."""
    rows = table[table["kind"] == "per_prompt"] if "kind" in table else table
    out = {}
    for (key, task), sub in rows.groupby(["model_key", "task"], sort=False):
        last = sub.loc[sub["n_heads"].astype(int).idxmax()]
        out[(str(key), str(task))] = np.array(json.loads(last["values"]), dtype=float)
    return out


def draw_of(row) -> int:
    """The prompt draw a model row was measured on (0 for a run recorded before draws: every model on one set)."""
    draw = row.get("draw", 0) if hasattr(row, "get") else 0
    return int(draw) if pd.notna(draw) else 0


def originals(models: pd.DataFrame, per: dict, task: str) -> dict[int, tuple[pd.Series, np.ndarray]]:
    """draw -> the original's model row on `task` and its attributions there (the draws it was measured on)."""
    rows = models[(models["cell"] == "original") & (models["task"] == task)]
    return {draw_of(row): (row, per[(str(row["model_key"]), task)]) for _, row in rows.iterrows()
            if (str(row["model_key"]), task) in per}


def _cells(models: pd.DataFrame) -> dict[str, list[str]]:
    """cell -> its model keys in replicate order (the original excluded)."""
    variants = models[models["cell"] != "original"].drop_duplicates("model_key")
    return {str(c): list(sub.sort_values("replicate")["model_key"]) for c, sub in variants.groupby("cell", sort=False)}


def needed(ref, luck):
    """The overlap a variant must exceed to keep the circuit: KEEP of the way from chance C to the original's own
    split-half overlap R, C + KEEP (R - C) = (R + C) / 2 (elementwise for an array of R)."""
    return luck + KEEP * (ref - luck)


def circuit_k(model_row, min_k: int) -> int:
    return config_circuit_k(float(model_row["heads_needed"]), int(model_row["total_heads"]), min_k)


# --- derived tables -----------------------------------------------------------------------------------------------

# the tables `derive` makes from the measurements (made again, never kept, when a run is re-judged)
DERIVED = ("curve", "reference", "overlap", "replicate_overlap", "heads", "comparison", "pathway_comparison")


def derive(table: pd.DataFrame, config) -> pd.DataFrame:
    """The measurements (the recipe's rows) with the tables derived from them: curve rows (explained effect per model
    and task), the overlap curves over k (each variant replicate with the original; the original's split-half
    reference; replicate against replicate within a cell), the heads kept, lost and new at the claim's k, and the
    comparison tables (claims_of). Rows of a derived kind already in `table` are replaced (`lmlab verdict`)."""
    table = table[~table["kind"].isin(DERIVED)].reset_index(drop=True)
    seed, min_k = config.seed, config.min_k
    models = table[table["kind"] == "model"]
    per = attributions(table)
    rows = _curve_rows(table[table["kind"] == "per_prompt"])
    variants = table[table["kind"] == "variant"]
    one_model = {str(c) for c, n in variants.groupby("cell").size().items() if n == 1} if len(variants) else set()
    for task in dict.fromkeys(models["task"]):
        rows += _overlap_rows(models, per, task, seed, min_k, one_model)
    out = pd.concat([table, pd.DataFrame(rows)], ignore_index=True)
    claims, _ = claims_of(out, config)
    comparison = [_comparison_row(c) for c in claims if c.name == "keeps the circuit"]
    extra = {(c.group, c.name): c for c in claims}
    for row in comparison:
        rank = extra.get((row["_group"], "rank correlation"))
        metric = extra.get((row["_group"], "task metric change"))
        row["spearman"] = rank.estimate if rank else float("nan")
        if metric:
            row["metric_change"], (row["metric_lo"], row["metric_hi"]) = metric.estimate, metric.interval()
        row.update(_task_done(models, row["cell"], row["task"]))
        del row["_group"]
    pathways = [_pathway_row(c) for c in claims if c.name == "keeps the pathway"]
    return pd.concat([out, pd.DataFrame(comparison), pd.DataFrame(pathways)], ignore_index=True)


def _task_done(models: pd.DataFrame, cell: str, task: str) -> dict:
    """Whether a variant still does the task at all: its clean metric (the answer's logit over the distractor's, mean
    over its replicates) above its corrupted one. At or below, it has lost the task, not only the circuit."""
    rows = models[(models["cell"] == cell) & (models["task"] == task)]
    clean, corrupted = float(rows["clean_metric"].mean()), float(rows["corrupted_metric"].mean())
    return {"clean_metric": clean, "corrupted_metric": corrupted, "task_lost": bool(clean <= corrupted)}


def _curve_rows(pp: pd.DataFrame) -> list[dict]:
    """Explained effect at each N, per model and task, from the per-prompt metrics (NaN where there is no effect)."""
    rows = []
    for (key, task), sub in pp.groupby(["model_key", "task"], sort=False):
        sub = sub.sort_values("n_heads")
        values = np.array([json.loads(v) for v in sub["values"]])
        top, bottom = values[-1].mean(), values[0].mean()
        effect = abs(top - bottom) > 1e-6 * max(abs(top), abs(bottom), 1.0)
        first = sub.iloc[0]
        rows += [{"kind": "curve", "model_key": key, "cell": first["cell"], "replicate": first["replicate"],
                  "task": task, "n_heads": int(n), "value": float((v.mean() - bottom) / (top - bottom)) if effect
                  else float("nan")} for n, v in zip(sub["n_heads"], values)]
    return rows


def _overlap_rows(models: pd.DataFrame, per: dict, task: str, seed: int, min_k: int,
                  one_model: set[str] = frozenset()) -> list[dict]:
    """One task's overlap curves over k, like for like on the same half-splits as the claim: the original's split-half
    reference R (its draws pooled), each variant replicate's V against the original on the replicate's own draw (and,
    as a description, the Jaccard of the two models' top-k on every prompt pair), replicate against replicate within
    a cell of several models (one's half against the other's other half; not for a cell that is one model read on
    several draws, `one_model`); and each cell's heads kept, lost and new."""
    origs = originals(models, per, task)
    if not origs:
        return []
    first = origs[min(origs)][0]
    total = scored_heads(origs[min(origs)][1])
    k_claim = max(circuit_k(row, min_k) for row, _ in origs.values())
    ks = list(range(1, min(max(K_MAX, k_claim), total) + 1))
    rows = []
    for k in ks:
        ref = np.concatenate([self_overlap(a, k, seed + d) for d, (_, a) in origs.items()])
        rows.append({"kind": "reference", "task": task, "k": k, "value": float(ref.mean()),
                     "lo": float(np.percentile(ref, 2.5)), "hi": float(np.percentile(ref, 97.5)),
                     "chance": chance(k, total)})
    for cell, keys in _cells(models).items():
        keys = [key for key in keys if (key, task) in per and _draw_of_key(models, key, task) in origs]
        for key in keys:
            b, d = per[(key, task)], _draw_of_key(models, key, task)
            a = origs[d][1]
            n = a.shape[0]
            ones, point = np.ones((1, n)) / n, half_splits(n, SPLITS, seed + d)
            rep = int(models[models["model_key"] == key]["replicate"].iloc[0])
            rows += [{"kind": "overlap", "cell": cell, "replicate": rep, "task": task, "k": k,
                      "split_jaccard": float(split_overlaps(a, [b], np.ones((1, n)), k, *point)[1][0][0]),
                      "jaccard": float(jaccard(top_masks(a, ones, k), top_masks(b, ones, k))[0]),
                      "spearman": spearman_union(a.mean(0), b.mean(0), k)} for k in ks]
        for k in ks if len(keys) > 1 and cell not in one_model else []:
            n = per[(keys[0], task)].shape[0]
            point = half_splits(n, SPLITS, seed)
            pairs = [float(split_overlaps(per[(x, task)], [per[(y, task)]], np.ones((1, n)), k, *point)[1][0][0])
                     for i, x in enumerate(keys) for y in keys[i + 1:] if per[(y, task)].shape[0] == n]
            rows.append({"kind": "replicate_overlap", "cell": cell, "task": task, "k": k, "value": float(np.mean(pairs)),
                         "lo": float(np.min(pairs)), "hi": float(np.max(pairs))})
        if keys:
            pairs = [(origs[_draw_of_key(models, key, task)], per[(key, task)]) for key in keys]
            rows.append(_heads_row(cell, task, [(a, circuit_k(row, min_k), b) for (row, a), b in pairs],
                                   int(first["n_heads"])))
    return rows


def _draw_of_key(models: pd.DataFrame, key: str, task: str) -> int:
    rows = models[(models["model_key"] == key) & (models["task"] == task)]
    return draw_of(rows.iloc[0]) if len(rows) else 0


def _pathway_row(c) -> dict:
    low, high = c.interval()
    return {"kind": "pathway_comparison", "cell": c.group.partition(" / ")[0], "dataset": c.group.partition(" / ")[2],
            "estimate": c.estimate, "lo": low, "hi": high, "decision": c.decision, "replicates": c.replicates,
            "decisive": not c.reported, "reason": c.reason if c.decision == "open" and not c.reported else "",
            **c.extra}


def _name(index: int, n_heads: int) -> str:
    return f"L{index // n_heads}.H{index % n_heads}"


def _heads_row(cell: str, task: str, reps: list[tuple[np.ndarray, int, np.ndarray]], n_heads: int) -> dict:
    """The original's top-k heads the variant keeps in its own top-k (in how many replicates), those it keeps in none,
    and the heads new to its top-k; each replicate read against the original on its own draw at that draw's k
    (`reps`: (the original's attributions, k, the variant's)); named L{layer}.H{head}, in the order of the original's
    mean attribution over the draws."""
    pairs = []
    for a, k, b in reps:
        ones = np.ones((1, a.shape[0])) / a.shape[0]
        pairs.append((top_masks(a, ones, k)[0], top_masks(b, np.ones((1, b.shape[0])) / b.shape[0], k)[0]))
    kept_count = np.sum([m & o for o, m in pairs], axis=0)
    new_count = np.sum([m & ~o for o, m in pairs], axis=0)
    in_original = np.any([o for o, _ in pairs], axis=0)
    n = max(len(pairs), 1)
    order = np.argsort(-np.abs(np.mean([a.mean(0) for a, _, _ in reps], axis=0)))

    def names(selected, counts=None):
        return ", ".join(_name(i, n_heads) + (f" ({counts[i]}/{n})" if counts is not None and n > 1 else "")
                         for i in order if selected[i])
    return {"kind": "heads", "cell": cell, "task": task, "k": int(round(np.mean([k for _, k, _ in reps]))),
            "kept": names(kept_count > 0, kept_count), "lost": names(in_original & (kept_count == 0)),
            "new": names(new_count > 0, new_count)}


def _comparison_row(c) -> dict:
    low, high = c.interval()
    e = c.extra
    to_decide = ""
    if c.decision == "open" and not c.ceiling:
        to_decide = c.sizing().get("text", "")
    return {"kind": "comparison", "_group": c.group, "cell": c.group.partition(" / ")[0],
            "task": c.group.partition(" / ")[2], "k": e["k"], "estimate": c.estimate, "lo": low, "hi": high,
            "bar": c.bar.value, "overlap": e["overlap"], "self_overlap": e["self_overlap"], "self_lo": e["self_lo"],
            "self_hi": e["self_hi"], "chance": e["chance"], "midpoint": e["midpoint"], "relative": e["relative"],
            "jaccard": e["jaccard"], "replicate_overlap": e["replicate_overlap"], "replicates": c.replicates,
            "df": c.df, "decision": c.decision, "reason": c.reason, "to_decide": to_decide,
            "original_heads": e["original_heads"], "variant_heads": e["variant_heads"],
            "original_induction": e.get("original_induction", np.nan),
            "variant_induction": e.get("variant_induction", np.nan)}


# --- claims -------------------------------------------------------------------------------------------------------

READS = ("model", "attribution", "per_prompt", "replicate_overlap", "pathway", "pathway_note")  # what claims_of reads
_MEASURED: dict = {}  # claims_of's last answer, for its next call alone, by a digest of what it read (`_digest`)


def claims_of(table: pd.DataFrame, config):
    """Per variant cell and task: keeps the circuit (decisive: D = V - (R + C) / 2 on the same half-splits, see the
    module's docstring), rank correlation and the task metric's change (reported); each decided (Bonferroni over the
    decisive ones, for "no" and "yes" alike), an open one with its reason. Returns (claims, gates).

    Measured once: a run's `derive` (its comparison table) and its `verdict` read the same rows, the one as a stacked
    frame, the other from the split tables. The claims are kept for the next call alone (the resamples are most of a
    verdict's time), which takes them where it reads the same rows and settings (a digest of them): a run's verdict
    after its derive, a re-judged run's after its own derive (measured again there, under the rules of the day)."""
    import copy

    key = _digest(table, config)
    if key is not None and key in _MEASURED:
        return _MEASURED.pop(key)
    found = _claims_of(table, config)
    _MEASURED.clear()
    if key is not None:
        _MEASURED[key] = copy.deepcopy(found)
    return found


def _digest(table: pd.DataFrame, config) -> str | None:
    """A digest of the rows claims_of reads (each kind of READS with its own columns, in a fixed order) and the
    settings it reads; None where a column cannot be hashed (then nothing is kept)."""
    import hashlib

    digest = hashlib.sha256(repr((config.seed, config.min_k, config.min_verify)).encode())
    for kind in READS:
        part = table[table["kind"] == kind].drop(columns=["kind", "model"], errors="ignore").dropna(axis=1, how="all")
        part = part[sorted(part.columns)].reset_index(drop=True)
        try:
            hashed = pd.util.hash_pandas_object(part, index=False).to_numpy()
        except TypeError:
            return None
        digest.update(repr((kind, list(part.columns), [str(t) for t in part.dtypes])).encode() + hashed.tobytes())
    return digest.hexdigest()


def _claims_of(table: pd.DataFrame, config):
    """claims_of, measured."""
    settings = {"seed": config.seed, "min_k": config.min_k, "min_verify": config.min_verify}
    models = table[table["kind"] == "model"]
    per, metric = attributions(table), clean_metrics(table)
    replicate_overlap = table[table["kind"] == "replicate_overlap"] if "kind" in table else table.iloc[:0]
    claims = []
    for task in dict.fromkeys(models["task"]):
        claims += _task_claims(task, models, per, metric, replicate_overlap, **settings)
    from lmlab.studies.compare.pathways import pathway_claims

    claims += pathway_claims(table, declared(CLAIMS, "keeps the pathway"))
    decisive = [c for c in claims if not c.reported]
    m = max(len(decisive), 1)
    for c in claims:  # every comparison is an answer of its own: "keeps" guarded as "does not keep" is
        c.guard_yes = not c.reported
        c.decide(1 - 0.05 / m if not c.reported else 0.95)
        if c.name == "keeps the circuit":
            c.reason = why_open(c)
    return claims, []


def _reference(a: np.ndarray, k: int, seed: int) -> dict:
    """The original's own half-against-half overlap R at `k` on one draw's claim splits, with its interval over the
    resamples of the prompt pairs every cell's claim on that draw makes; those splits and resamples; k and chance."""
    n = a.shape[0]
    point = half_splits(n, SPLITS, seed)  # the estimates: many splits
    draws = half_splits(n, BOOT_SPLITS, seed + 1)  # each resample of the prompt pairs: fewer
    counts = Resampler(n, 1, n_boot=1000, seed=seed).counts()  # the draws every cell's claim makes on this draw
    ref = float(split_overlaps(a, [], np.ones((1, n)), k, *point)[0][0])
    boot = split_overlaps(a, [], counts, k, *draws)[0]
    se = float(np.nanstd(boot, ddof=1)) if np.isfinite(boot).sum() > 1 else float("nan")
    return {"point": point, "draws": draws, "counts": counts, "ref": ref, "se": se, "k": k,
            "chance": chance(k, scored_heads(a)), "lo": max(ref - 1.96 * se, 0.0),  # a Jaccard lies in [0, 1]
            "hi": min(ref + 1.96 * se, 1.0)}


def _cell_replicates(models, per, origs: dict, keys: list, task: str) -> tuple[list, list]:
    """A cell's models on this task that were measured on a draw the original was read on, and (draw, per-prompt
    values) for each; read on several draws, a draw where the original has no effect has nothing to compare and is
    left out (unless every draw is such)."""
    keys = [key for key in keys if (key, task) in per and _draw_of_key(models, key, task) in origs]
    reps = [(_draw_of_key(models, key, task), per[(key, task)]) for key in keys]
    if len({d for d, _ in reps}) > 1:
        kept = [i for i, (d, _) in enumerate(reps) if bool(origs[d][0]["has_effect"])]
        keys, reps = ([keys[i] for i in kept], [reps[i] for i in kept]) if kept else (keys, reps)
    return keys, reps


def _cell_extras(k: int, cell: str, task: str, replicate_overlap: pd.DataFrame, orig_rows: pd.DataFrame,
                 rows: pd.DataFrame) -> dict:
    """What a cell's circuit claim shows beside its numbers: replicate-to-replicate overlap at its k, the heads the
    original and the variant need, and their induction scores (NaN where not measured)."""
    rep_rows = replicate_overlap[(replicate_overlap["cell"] == cell) & (replicate_overlap["task"] == task)
                                 & (replicate_overlap["k"] == k)] if len(replicate_overlap) else []
    return {"replicate_overlap": float(rep_rows["value"].iloc[0]) if len(rep_rows) else float("nan"),
            "original_heads": float(orig_rows["heads_needed"].mean()),
            "variant_heads": float(rows["heads_needed"].mean()),
            "original_induction": float(orig_rows["induction_score"].mean())
            if "induction_score" in orig_rows else float("nan"),
            "variant_induction": float(rows["induction_score"].mean()) if "induction_score" in rows
            else float("nan")}


def _task_claims(task, models, per, metric, replicate_overlap, seed: int, min_k: int, min_verify: float) -> list:
    """One task's claims, three per variant cell (undecided). Each replicate of a cell is read against the original
    on the replicate's own prompt draw, at that draw's k and R (lmlab.compare.measure): the prompt pairs, k and R vary
    between the replicates as they vary between run seeds, and the interval carries them."""
    origs = originals(models, per, task)
    if not origs:
        return []
    refs = {d: _reference(a, circuit_k(row, min_k), seed + d) for d, (row, a) in origs.items()}
    claims = []
    for cell, keys in _cells(models[models["task"] == task]).items():
        keys, reps = _cell_replicates(models, per, origs, keys, task)
        if not keys:
            continue
        shared = len({d for d, _ in reps}) == 1
        n = reps[0][1].shape[0]
        sampler = Resampler(n, len(keys), n_boot=1000, seed=seed, shared=shared)
        rows = models[(models["task"] == task) & models["model_key"].isin(keys)]
        group = f"{cell} / {task}"
        c = _circuit_claim(origs, refs, reps, sampler, group)
        held = (_held_open([origs[d][0] for d in sorted({d for d, _ in reps})], rows, min_verify)
                or _not_replicated(c.extra["self_overlap"], c.extra["self_lo"], c.extra["self_hi"], c.extra["chance"]))
        if held:
            c.ceiling = held
        c.extra.update(_cell_extras(c.extra["k"], cell, task, replicate_overlap,
                                    pd.DataFrame([origs[d][0] for d, _ in reps]), rows))
        claims.append(c)
        claims.append(declared(CLAIMS, "rank correlation").measure(
            sampler.claim, lambda r, idx, reps=reps: spearman_union(
                origs[reps[r][0]][1][idx].mean(0), reps[r][1][idx].mean(0), refs[reps[r][0]]["k"])
            if len(idx) else float("nan"), group=group, n_unit="prompt pairs", reported=True))
        okeys = {d: str(origs[d][0]["model_key"]) for d in origs}
        if all((okeys[d], task) in metric and (key, task) in metric for key, (d, _) in zip(keys, reps)):
            diff = np.stack([metric[(key, task)] - metric[(okeys[d], task)] for key, (d, _) in zip(keys, reps)])
            claims.append(declared(CLAIMS, "task metric change").measure(sampler.mean_claim, diff, group=group,
                                                                         n_unit="prompt pairs", reported=True))
    return claims


def _circuit_claim(origs: dict, refs: dict, reps: list[tuple[int, np.ndarray]], sampler: Resampler, group: str):
    """keeps the circuit for one cell: D = V - (R + C) / 2 per replicate, against the original on the replicate's
    own draw at that draw's k, R and C, on that draw's splits; its resamples re-rank both models on both halves (R
    recomputed on every draw, paired with V)."""
    v_point, d_point, d_boot, whole = [], [], [], []
    for d, b in reps:
        a, ref = origs[d][1], refs[d]
        n, k, luck = a.shape[0], ref["k"], ref["chance"]
        v = float(split_overlaps(a, [b], np.ones((1, n)), k, *ref["point"])[1][0][0])
        r_boot, v_boot = split_overlaps(a, [b], ref["counts"], k, *ref["draws"])
        v_point.append(v)
        d_point.append(v - needed(ref["ref"], luck))
        d_boot.append(v_boot[0] - needed(r_boot, luck))
        ones = np.ones((1, n)) / n
        whole.append(float(jaccard(top_masks(a, ones, k), top_masks(b, ones, k))[0]))
    d_reps = np.stack(d_boot)  # (replicates, resamples)
    fin = np.isfinite(d_reps)
    boot = np.where(fin.any(0), np.where(fin, d_reps, 0.0).sum(0) / np.maximum(fin.sum(0), 1), np.nan)
    spec = declared(CLAIMS, "keeps the circuit")
    c = spec.measure(sampler.combine, np.array(d_point), boot, group=group, n_unit="prompt pairs")
    used = sorted({d for d, _ in reps})
    ref, luck = _pooled_reference([refs[d] for d in used])
    overlap, mid = float(np.mean(v_point)), float(np.mean([needed(refs[d]["ref"], refs[d]["chance"]) for d, _ in reps]))
    c.extra = {"k": int(round(np.mean([refs[d]["k"] for d, _ in reps]))), "k_draws": [refs[d]["k"] for d in used],
               "overlap": overlap,
               "self_overlap": ref["ref"], "self_lo": ref["lo"], "self_hi": ref["hi"], "chance": luck, "midpoint": mid,
               "jaccard": float(np.mean(whole)), "draws": len(used),
               "relative": float((overlap - luck) / (ref["ref"] - luck)) if ref["ref"] > luck else float("nan")}
    return c


def _pooled_reference(refs: list[dict]) -> tuple[dict, float]:
    """The original's self-overlap R over the draws a cell was read on (the mean, its standard error from each
    draw's) and chance at their k (the mean)."""
    value = float(np.mean([r["ref"] for r in refs]))
    se = float(np.sqrt(np.nansum([r["se"] ** 2 for r in refs])) / len(refs))
    return ({"ref": value, "lo": max(value - 1.96 * se, 0.0), "hi": min(value + 1.96 * se, 1.0)},
            float(np.mean([r["chance"] for r in refs])))


def _not_replicated(ref: float, low: float, high: float, luck: float) -> str:
    """Why no comparison on a task can decide when the original's own top-k does not replicate across halves of the
    prompt pairs (R's interval not clear of chance), or ""."""
    if np.isfinite(low) and low > luck:
        return ""
    return (f"the original's own top-k does not replicate across halves of the prompt pairs (R {ref:.2f} "
            f"[{low:.2f}, {high:.2f}] against chance {luck:.2f}): no variant can be told from it or from chance; more "
            "prompt pairs would tell")


def why_open(c) -> str:
    """An open circuit claim's reason, in words that say what keeps it open (the hold; the replicates' disagreement;
    the interval across 0; the interval past 0, or short of it, at 95% but not at the level its answer is read at), with the degrees of
    freedom where few replicates set the interval's width; "" for a decided one."""
    from lmlab.claims import t_quantile

    if c.decision != "open":
        return ""
    if c.ceiling or not np.isfinite(c.estimate) or "replicates disagree" in c.reason:
        return c.reason
    low, high = c.interval()
    e = getattr(c, "extra", {}) or {}
    where = (f" (V {e['overlap']:.2f} against the midpoint {e['midpoint']:.2f} of R {e['self_overlap']:.2f} and "
             f"chance {e['chance']:.2f})" if e else "")
    if low <= 0 <= high:
        out = f"the interval of D [{low:+.2f}, {high:+.2f}] includes 0{where}: the run cannot tell it either way"
    else:
        side, level, word = (("above", c.yes_confidence, "'keeps'") if low > 0 else
                             ("below", c.no_confidence, "'does not keep'"))
        out = (f"D [{low:+.2f}, {high:+.2f}] is {side} 0 at 95%{where} but not at the {100 * level:.4g}% "
               f"that {word} is read at (Bonferroni over the run's comparisons)")
    if c.replicates >= 2 and c.df < 10:
        out += (f"; {c.replicates} replicates leave the interval {c.df:.1f} degrees of freedom (t "
                f"{t_quantile(c.df):.1f} at 95%, {t_quantile(c.df, c.no_confidence):.1f} where either answer is read), the "
                f"spread between replicates (SE {c.se_seed:.2f}) beside the prompt pairs' (SE {c.se_item:.2f})"
                + (": two replicates give that spread one degree of freedom, more replicates would narrow it"
                   if c.replicates == 2 else ": more replicates would narrow it"))
    return out


def _held_open(origs: list, rows: pd.DataFrame, min_verify: float) -> str:
    """Why a task's comparison cannot decide (the original has no effect on any draw the cell is read on; a ranking
    not confirmed by activation patching), or "". On one draw (a run of one draw, or one recorded before draws) any
    model below `min_verify` holds the cell; read on several draws, the original's Spearman is averaged over its draws
    and the variant's over its replicates, so more draws never hold a cell open more often."""
    if not any(bool(o["has_effect"]) for o in origs):
        return "the original shows no effect on this task to explain (clean metric = every head patched)"
    # (a column of NaN only, where no model had three heads checked, is not in the table)
    rhos = rows["verify_rho"] if "verify_rho" in rows else pd.Series(np.nan, index=rows.index)
    if len(origs) == 1:
        checked = [("the original", origs[0].get("verify_rho", np.nan))] + [
            (f"replicate {int(r)}", rho) for r, rho in zip(rows["replicate"], rhos)]
    else:
        finite = [float(o.get("verify_rho", np.nan)) for o in origs if np.isfinite(o.get("verify_rho", np.nan))]
        mine = rhos[np.isfinite(rhos)]
        checked = [(f"the original (mean over {len(finite)} draws)", float(np.mean(finite)) if finite else np.nan),
                   (f"the variant (mean over {len(mine)} replicates)", float(mine.mean()) if len(mine) else np.nan)]
    weak = [(who, rho) for who, rho in checked if np.isfinite(rho) and rho < min_verify]
    if weak:
        return ("attribution does not track activation patching on the top heads of "
                + ", ".join(f"{who} (Spearman {rho:.2f})" for who, rho in weak)
                + f", below {min_verify:g}: its ranking cannot be compared")
    return ""


def cell_widths(variants: pd.DataFrame) -> dict[str, tuple[str, int]]:
    """{cell: (method, bits)} of the variants at a bit width (made by --make rtn:8,4,3,2 and the like, or folders named
    METHOD-Bbit), as the recipe recorded them in the `variant` table (a run recorded before it did: read from the
    cell's name)."""
    if "method" in variants:
        at = variants[variants["method"].notna()]
        return {str(c): (str(m), int(b)) for c, m, b in zip(at["cell"], at["method"], at["bits"])}
    return {str(c): w for c in variants.get("cell", []) if (w := width_of_name(str(c))) is not None}


def fewest_bits(keeps, widths: dict[str, tuple[str, int]]) -> list[dict]:
    """Per method made at several bit widths (`widths`: cell_widths) and task: the fewest bits that keep the circuit,
    read down from the widest: the last of the unbroken run of "keeps" from the top (`kept`, None where the widest
    does not), and what the next width says (`next_bits`, `next`: a width that does not keep, or cannot tell, ends
    the run)."""
    by: dict[tuple[str, str], dict[int, str]] = {}
    for c in keeps:
        cell, _, task = c.group.partition(" / ")
        if cell in widths:
            method, bits = widths[cell]
            by.setdefault((method, task), {})[bits] = c.decision
    lines = []
    for (method, task), by_bits in by.items():
        if len(by_bits) < 2:
            continue
        order = sorted(by_bits, reverse=True)
        kept = None
        for bits in order:
            if by_bits[bits] != "yes":
                break
            kept = bits
        after = [b for b in order if kept is None or b < kept][:1]
        lines.append({"method": method, "task": task, "kept": kept, "next_bits": after[0] if after else None,
                      "next": by_bits[after[0]] if after else None})
    return lines


def _keep_part(c, models: pd.DataFrame) -> dict:
    """One variant and task's answer, with the numbers that decided it."""
    low, high = c.interval()
    e = c.extra
    done = _task_done(models, c.group.partition(" / ")[0], c.group.partition(" / ")[2])
    return {"kind": "compare_keep", "group": c.group, "decision": c.decision, "k": int(e["k"]),
            "k_draws": [int(k) for k in e.get("k_draws", [e["k"]])], "overlap": float(e["overlap"]),
            "self_overlap": float(e["self_overlap"]), "self_lo": float(e["self_lo"]), "self_hi": float(e["self_hi"]),
            "chance": float(e["chance"]), "estimate": float(c.estimate), "low": float(low), "high": float(high),
            "replicates": int(c.replicates), "n": int(c.n), "draws": int(e.get("draws", 1)),
            "replicate_overlap": float(e["replicate_overlap"]), "reason": c.reason or "",
            "task_lost": bool(done["task_lost"]), "clean_metric": float(done["clean_metric"]),
            "corrupted_metric": float(done["corrupted_metric"])}


def verdict(result) -> Verdict:
    claims, gates = claims_of(_stacked(result), result.config)
    seconds = float(getattr(result, "seconds", 0.0) or 0.0)
    judgement = judge(claims, gates, seconds=seconds)
    keeps = [c for c in claims if c.name == "keeps the circuit"]
    lines = [_keep_part(c, result.table("model")) for c in keeps] + _swap_parts(result)
    lines += [_pathway_part(c) for c in claims if c.name == "keeps the pathway"]
    notes = result.table("pathway_note")
    lines += [{"kind": "compare_no_pathway", "cell": str(r.cell), "replicate": int(r.replicate), "note": str(r.note)}
              for r in notes.itertuples()]
    hybrid = result.meta.get(result.models[0], {}).get("hybrid") if len(result.models) == 1 else None
    lines += [{"kind": "compare_hybrid", "layers": hybrid}] if hybrid else []
    status, head = top_part(judgement.status, keeps, gates, cell_widths(result.table("variant")))
    parts = [head, {"kind": "compare_lines", "lines": lines}, {"kind": "compare_closing"}]
    scope = f"this run: {result.models[0] if result.models else 'the model'} against its variants"
    found = evidence(claims, gates, scope=scope, judgement=judgement)
    if keeps:  # what decides here is the answer for each variant, not one claim: the line the report heads with
        said = part_text(answers_part(keeps))
        found["deciding"] = {"status": status, "kind": "claim", "name": "each variant's circuits", "source": "lmlab",
                             "where": "no paper claims this; the rule: D = V - (R + C) / 2 "
                                      + declared(CLAIMS, "keeps the circuit").bar + " on the same half-splits",
                             "bar": declared(CLAIMS, "keeps the circuit").bar, "bar_note": "", "decision": "",
                             "line": said, "text": said}
    return Verdict(status=status, claim="Each variant keeps the original's circuit on each task (lmlab's question)",
                   parts=parts, evidence=found)


def _swap_parts(result) -> list[dict]:
    """A part per swap of the run (the placebo's variants): which of the original's top heads it moved, ranked on
    which prompt pairs, how many of them the overlap reads, and any that could not leave the top."""
    placebo = result.table("placebo")
    if not len(placebo):
        return []
    judged = _judged_top(result, placebo)
    lines = []
    for row in placebo.itertuples():
        read = judged.get(row.task)
        lines.append({"kind": "compare_swap", "cell": str(row.cell), "task": str(row.task), "moved": int(row.moved),
                      "k": int(row.k), "heads": str(row.heads), "other_pairs": bool(row.chosen_on_other_pairs),
                      "within": sum(h in read for h in str(row.heads).split(", ")) if read is not None else None,
                      "stuck": int(row.stuck) if row.stuck else 0, "stuck_heads": str(row.stuck_heads)})
    return lines


def _pathway_part(c) -> dict:
    """A "keeps the pathway" claim, beside the original's own pathway."""
    low, high = c.interval()
    o = c.extra
    return {"kind": "compare_pathway", "group": c.group, "decision": c.decision, "reported": bool(c.reported),
            "estimate": float(c.estimate), "low": float(low), "high": float(high), "replicates": int(c.replicates),
            "original": float(o["original"]), "original_lo": float(o["original_lo"]),
            "original_hi": float(o["original_hi"]), "original_decision": o["original_decision"],
            "reason": c.reason or ""}


def top_part(status: str, keeps, gates, widths: dict[str, tuple[str, int]]) -> tuple[str, dict]:
    """The run's status and its first part: "answered" where at least one comparison answered (keeps or does not
    keep) and no gate blocks every decision, with the counts (keep, do not, open) and, per method made at several
    widths and task, the fewest bits that keep; else the judged status ("inconclusive"), with the counts."""
    counts = {d: sum(c.decision == d for c in keeps) for d in ("yes", "no", "open")}
    blocked = any(not g.passed and not g.scoped and g.blocks == "all" for g in gates)
    answered = bool(keeps) and not blocked and counts["yes"] + counts["no"] > 0
    head = {"kind": "compare_top", "answered": answered, "comparisons": len(keeps), "keep": counts["yes"],
            "not": counts["no"], "open": counts["open"], "fewest": fewest_bits(keeps, widths) if keeps else []}
    return ("answered" if answered else status), head


def _judged_top(result, placebo: pd.DataFrame) -> dict[str, set[str]]:
    """task -> the names of the original's top-k heads on the judged prompt pairs (k as the placebo table has it)."""
    models = result.table("model")
    per = attributions(result.table("attribution").assign(kind="attribution"))
    out = {}
    for row in placebo.drop_duplicates("task").itertuples():
        orig = models[(models["model_key"] == "original") & (models["task"] == row.task)]
        if ("original", row.task) not in per or orig.empty:
            continue
        a = per[("original", row.task)]
        mask = top_masks(a, np.ones((1, a.shape[0])), int(row.k))[0]
        out[row.task] = {_name(int(i), int(orig.iloc[0]["n_heads"])) for i in np.flatnonzero(mask)}
    return out


def answers_part(keeps) -> dict:
    """Per variant cell, its answer on each task with D's interval (an open one with its reason)."""
    out = []
    for c in keeps:
        cell, _, task = c.group.partition(" / ")
        low, high = c.interval()
        out.append({"cell": cell, "task": task, "decision": c.decision, "estimate": float(c.estimate),
                    "low": float(low), "high": float(high), "reason": c.reason or ""})
    return {"kind": "compare_answers", "answers": out}


def _stacked(result) -> pd.DataFrame:
    """The tables the claims read, stacked with their kind."""
    parts = [result.table(name).assign(kind=name) for name in READS]
    return pd.concat([p for p in parts if len(p)], ignore_index=True)


def report_rows(result) -> pd.DataFrame:
    """One row per variant cell and task: the answer, the overlap with its interval and bar, the circuit sizes."""
    table = result.table("comparison")
    if table.empty:
        return table
    out = pd.DataFrame({
        "variant": table["cell"], "task": table["task"],
        "keeps circuit": table["decision"].map(ANSWER),
        "top-k": table["k"].astype(int),
        "V - (R+C)/2 [95%]": [f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]" for d, lo, hi in zip(table["estimate"], table["lo"],
                                                                                     table["hi"])],
        "V (variant vs original)": table["overlap"].round(2), "R (original vs itself)": table["self_overlap"].round(2),
        "chance": table["chance"].round(2),
        "replicates": table["replicates"].astype(int),
        "heads@0.9 orig/var": [f"{_n(a)}/{_n(b)}" for a, b in zip(table["original_heads"], table["variant_heads"])],
        "metric change": table["metric_change"].round(3),
        **({"induction score orig/var": [f"{a:.2f}/{b:.2f}" if np.isfinite(a) and np.isfinite(b) else "-" for a, b in
                                          zip(table["original_induction"], table["variant_induction"])]}
           if "original_induction" in table and np.isfinite(table["original_induction"]).any() else {}),
        "why open": table["reason"].where(table["decision"] == "open", "").fillna("")})
    paths = result.table("pathway_comparison")
    if len(paths):
        out = pd.concat([out, pd.DataFrame({
            "variant": paths["cell"], "task": "pathway: " + paths["dataset"].astype(str),
            "keeps circuit": [ANSWER[d] if k else "nothing to keep" for d, k in zip(paths["decision"],
                                                                                   paths["decisive"])],
            "E_Q - control, pp [95%]": [f"{e:+.1f} [{lo:+.1f}, {hi:+.1f}]" for e, lo, hi in
                                        zip(paths["estimate"], paths["lo"], paths["hi"])],
            "original, pp": paths["original"].round(1), "replicates": paths["replicates"].astype(int),
            "why open": paths["reason"].fillna("") if "reason" in paths else ""})],
            ignore_index=True)
    return out


def _n(x) -> str:
    return "-" if not np.isfinite(x) else f"{x:.0f}"


# --- figure -------------------------------------------------------------------------------------------------------

COLORS = ["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def figure(result, fig=None):
    """Per task, one row: (1) each head's mean attribution, original (x) against each variant (y; replicates pooled),
    the original's top heads named; (2) the top-k overlap with the original against k, like for like (each model's
    top-k on one half of the prompt pairs against the original's on the other, on the same splits): each variant's mean
    over its replicates (band: lowest to highest), the original's split-half self-overlap R (grey band), chance
    (dotted), and at the claim's k the variant's V with the claim's interval and the bar (R + C) / 2 (a tick); (3)
    the explained-effect curves on one axis (each model along its own ranking); and (4), where a method was made at
    several bit widths (--make rtn:8,4,3,2, or variant folders named METHOD-Bbit), its D against bits with the
    claim's interval, the bar 0, a cross where the variant lost the task itself, and each width's perplexity on
    held-out text (dashed, in the method's colour, on its own log axis)."""
    models = result.table("model")
    tasks = list(dict.fromkeys(models["task"])) if len(models) else []
    bits = _by_bits(result.table("comparison"), cell_widths(result.table("variant")))
    columns = 4 if len(bits) else 3
    fig, axes = canvas(fig, (5 * columns, 3.8 * max(len(tasks), 1)), max(len(tasks), 1), columns, squeeze=False)
    if not tasks:
        return finish(fig)
    per = attributions(result.table("attribution").assign(kind="attribution"))
    cells = list(_cells(models))
    color = {c: COLORS[i % len(COLORS)] for i, c in enumerate(cells)}
    for row, task in zip(axes, tasks):
        _scatter_panel(row[0], models, per, task, cells, color)
        _overlap_panel(row[1], result, task, cells, color)
        _curve_panel(row[2], result.table("curve"), task, color)
        if len(bits):
            _bits_panel(row[3], bits, task, result.table("made"))
    fig.suptitle(f"{result.models[0] if result.models else ''}: does each variant keep the original's circuits? "
                 "(lmlab's comparison; no paper claims this)", fontsize=10)
    return finish(fig)


def _scatter_panel(ax, models, per, task, cells, color) -> None:
    origs = originals(models, per, task)
    n_heads = int(models[(models["cell"] == "original") & (models["task"] == task)].iloc[0]["n_heads"])
    if origs:
        x = np.mean([a.mean(0) for _, a in origs.values()], axis=0)
        for cell in cells:
            keys = models[(models["cell"] == cell) & (models["task"] == task)]["model_key"]
            ys = [per[(k, task)].mean(0) for k in keys if (k, task) in per]
            if ys:
                ax.scatter(x, np.mean(ys, axis=0), s=9, alpha=0.7, color=color[cell], label=cell)
        lim = [min(x.min(), 0), max(x.max(), 0)]
        ax.plot(lim, lim, color="grey", lw=0.8, ls=":")
        for i in np.argsort(-np.abs(x))[:5]:
            ax.annotate(_name(int(i), n_heads), (x[i], x[i]), fontsize=7, xytext=(3, -9), textcoords="offset points")
    ax.set_xlabel("original: mean attribution")
    ax.set_ylabel("variant: mean attribution")
    ax.set_title(f"{task}: head attribution (draws pooled)")
    ax.legend(fontsize=7, loc="upper left")


def _overlap_panel(ax, result, task, cells, color) -> None:
    overlap, reference = result.table("overlap"), result.table("reference")
    rep_overlap, comparison = result.table("replicate_overlap"), result.table("comparison")
    ref = reference[reference["task"] == task].sort_values("k") if len(reference) else reference
    if len(ref):
        ax.fill_between(ref["k"], ref["lo"], ref["hi"], color="grey", alpha=0.2, linewidth=0,
                        label="original, half vs half (95%)")
        ax.plot(ref["k"], ref["value"], color="grey", lw=1)
        ax.plot(ref["k"], ref["chance"], color="black", lw=0.8, ls=":", label="chance")
    for cell in cells:
        sub = overlap[(overlap["cell"] == cell) & (overlap["task"] == task)] if len(overlap) else overlap
        if sub.empty:
            continue
        piv = sub.pivot_table(index="k", columns="replicate",
                              values="split_jaccard" if "split_jaccard" in sub else "jaccard")
        ax.plot(piv.index, piv.mean(axis=1), color=color[cell], lw=1.8, label=f"{cell} vs original")
        if piv.shape[1] > 1:
            ax.fill_between(piv.index, piv.min(axis=1), piv.max(axis=1), color=color[cell], alpha=0.15, linewidth=0)
        rr = rep_overlap[(rep_overlap["cell"] == cell) & (rep_overlap["task"] == task)] if len(rep_overlap) else []
        if len(rr):
            ax.plot(rr["k"], rr["value"], color=color[cell], lw=0.9, ls="--", label=f"{cell}, replicate vs replicate")
        comp = comparison[(comparison["cell"] == cell) & (comparison["task"] == task)] if len(comparison) else []
        if len(comp):
            c = comp.iloc[0]
            if "midpoint" in c:  # the claim on the overlap's axis: V with D's interval moved by the midpoint
                y, bar, lo, hi = c["overlap"], c["midpoint"], c["lo"] + c["midpoint"], c["hi"] + c["midpoint"]
            else:  # a run recorded before the like-for-like claim
                y, bar, lo, hi = c["jaccard"], c["bar"], c["lo"], c["hi"]
            ax.errorbar([c["k"]], [y], yerr=[[y - lo], [hi - y]], color=color[cell], fmt="o", capsize=3)
            ax.plot([c["k"] - 0.6, c["k"] + 0.6], [bar] * 2, color="black", lw=2)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("k (top heads)")
    ax.set_ylabel("Jaccard overlap of the top-k")
    ax.set_title(f"{task}: overlap with the original, half vs half (bar: black tick)")
    ax.legend(fontsize=6, loc="lower right")


def _by_bits(comparison: pd.DataFrame, widths: dict[str, tuple[str, int]]) -> pd.DataFrame:
    """The comparison rows of methods at two or more bit widths (`widths`: cell_widths), with method and bits."""
    if not len(comparison):
        return comparison
    cells = comparison["cell"].astype(str)
    rows = comparison.assign(method=cells.map(lambda c: widths.get(c, (None, None))[0]),
                             bits=pd.to_numeric(cells.map(lambda c: widths.get(c, (None, None))[1]), errors="coerce"))
    rows = rows[rows["method"].notna()]
    widths = rows.groupby("method")["bits"].transform("nunique")
    return rows[widths >= 2]


def _bits_panel(ax, bits: pd.DataFrame, task: str, made: pd.DataFrame) -> None:
    methods = list(dict.fromkeys(bits[bits["task"] == task]["method"]))
    color = {m: COLORS[i % len(COLORS)] for i, m in enumerate(methods)}
    if len(made):  # each width's perplexity on held-out text, on its own (log) axis, in its method's colour
        other = ax.twinx()
        made = made.groupby(["method", "bits"], as_index=False, sort=False)["perplexity"].mean()  # replicates pooled
        for method, sub in made.sort_values("bits").groupby("method", sort=False):
            other.plot(sub["bits"], sub["perplexity"], color=color.get(method, "grey"), ls="--", marker="s", ms=3,
                       lw=0.8, alpha=0.6)
        other.set_yscale("log")
        other.set_ylabel("perplexity, held-out text (dashed)", fontsize=8)
    said = False
    for method, sub in bits[bits["task"] == task].groupby("method", sort=False):
        sub = sub.sort_values("bits")
        ax.errorbar(sub["bits"], sub["estimate"], yerr=[sub["estimate"] - sub["lo"], sub["hi"] - sub["estimate"]],
                    marker="o", capsize=3, color=color[method], label=method)
        lost = sub[sub["task_lost"].fillna(False).astype(bool)] if "task_lost" in sub else sub.iloc[:0]
        if len(lost):
            ax.scatter(lost["bits"], lost["estimate"], marker="x", s=70, color="black", zorder=3,
                       label=None if said else "the task itself lost")
            said = True
    ax.axhline(0, color="grey", ls=":", lw=1)
    ax.invert_xaxis()
    ax.set_xlabel("bits")
    ax.set_ylabel("D = V - (R + C)/2 (>= 0: keeps)")
    ax.set_title(f"{task}: the circuit against bits")
    ax.legend(fontsize=7)


def _curve_panel(ax, curves, task, color) -> None:
    for key, sub in curves[curves["task"] == task].groupby("model_key", sort=False):
        cell = str(sub["cell"].iloc[0])
        sub = sub.sort_values("n_heads")
        first = cell == "original"
        ax.plot(sub["n_heads"], sub["value"], color="tab:blue" if first else color.get(cell, "k"),
                lw=2.2 if first else 1.0, ls="-" if first else "--", zorder=1 if first else 2,
                label=cell if key.endswith("#0") or key == "original" else None)
    ax.axhline(0.9, color="grey", ls=":", lw=1)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=0)
    ax.set_ylim(-0.1, 1.15)
    ax.set_xlabel("heads kept (each model's own ranking)")
    ax.set_ylabel("explained effect")
    ax.set_title(f"{task}: explained effect")
    ax.legend(fontsize=7, loc="lower right")
