"""Compare's analysis: does each variant keep the original's circuit on each task?

Claims (lmlab's own: no paper claims this; declared in CLAIMS below):
- keeps the circuit (decisive): the Jaccard overlap of the variant's top-k heads with the original's, k the heads the
  original needs for 0.9 of the effect (at least `min_k`), each ranking by |mean attribution| over the same prompt
  pairs. Interval: prompt pairs resampled (both rankings recomputed on every draw, so the pairing holds) and, where a
  cell has replicates (students trained with different seeds), the replicates (lmlab.claims: a t interval over both
  levels).
  Bar, DECISION: midway between two reference levels measured in the run, bar = (R + C) / 2, where
    R = the original's split-half self-overlap: the Jaccard of its top-k heads ranked on one half of the prompt pairs
        with its top-k ranked on the other half (mean over random splits) -- what two independent measurements of the
        same model agree to; "two equally good models are the baseline, not 1.0";
    C = chance: the expected Jaccard of two random k-sets of the model's heads, k / (2N - k).
  "yes" (keeps it): the interval lies above the bar, closer to a re-measurement of the original than to an unrelated
  ranking; "no": below it; open otherwise. A variant identical to the original overlaps it 1.0 on every draw (the
  positive control); one whose top heads are zeroed drops them from its top-k (the negative control).
  The replicate-to-replicate overlap of a cell (two students of one recipe against each other) is reported beside it
  and drawn as a band; it is not the bar, since replicates that agree with each other and not with the original
  would set a bar that says nothing about the original.
- rank correlation (reported): Spearman's rho of the two models' mean attribution over the union of their top-k heads.
- task metric change (reported): the variant's clean metric minus the original's, paired prompt by prompt.
- keeps the pathway (with --pathways; pathways.py): S1's knockout effect on the variant where the original has it.
Per claim, DECISION: a model whose attribution does not track activation patching on its top heads (Spearman below
`min_verify`) or whose task has no effect to explain (clean metric = every head patched) holds that task's claim open:
a ranking that does not measure the heads cannot be compared.

The verdict's status follows lmlab's rule of whose claim decides what: no paper's claim is checked here, so it stays
"inconclusive"; the answer is per variant and task, in the verdict's summary, the `comparison` table and the figure.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from lmlab.claims import Bar, Declared, Resampler, declared, evidence, judge
from lmlab.studies.base import Verdict, canvas, finish
from lmlab.studies.compare.config import circuit_k as config_circuit_k

WHY = ("no paper claims this: lmlab's own question, whether compression keeps the mechanism and not only the accuracy "
       "(compression papers report accuracy and perplexity; circuit papers study one model at a time)")
CLAIMS = [
    Declared("keeps the circuit", "Jaccard overlap of the variant's top-k heads with the original's (k: the heads the "
             "original needs for 0.9 of the effect, at least min_k, at most half the heads), the same prompt pairs",
             ">= (R + C) / 2: midway between the original's split-half self-overlap R and chance C", "lmlab", WHY),
    Declared("rank correlation", "Spearman's rho of mean attribution over the union of both top-k sets", "reported",
             "lmlab", WHY, decisive=False),
    Declared("task metric change", "the variant's clean task metric minus the original's, paired by prompt",
             "reported", "lmlab", WHY, decisive=False),
    Declared("keeps the pathway", "the variant's E_Q ΔP - control ΔP (lmlab knockout's effect of blocking the "
             "question's exact tokens against random ones), mean over the cell's replicate models",
             "<= half the original's effect (midway between it and none); decisive where the original's own "
             "effect holds", "lmlab",
             "no paper claims this: whether a compressed model still routes truthfulness through the question-anchored "
             "pathway Luo et al. find in full-precision models (with --pathways)"),
]

# the tables the recipe hands to the analysis, and the columns each always carries
COLUMNS = {
    "model": ("model_key", "cell", "replicate", "task", "model_name", "clean_metric", "corrupted_metric", "metric",
              "n_prompts", "heads_needed", "total_heads", "has_effect", "verify_rho", "verify_heads", "n_layers",
              "n_heads"),
    "attribution": ("model_key", "cell", "replicate", "task", "idx", "scores"),
    "per_prompt": ("model_key", "cell", "replicate", "task", "n_heads", "values"),
    "verify_component": ("model_key", "task", "layer", "index", "attribution", "activation"),
    "variant": ("cell", "replicate", "model_key", "source", "variant_kind", "made"),
    "curve": ("model_key", "cell", "replicate", "task", "n_heads", "value"),
    "overlap": ("cell", "replicate", "task", "k", "jaccard", "spearman"),
    "reference": ("task", "k", "value", "lo", "hi", "chance"),
    "replicate_overlap": ("cell", "task", "k", "value", "lo", "hi"),
    "heads": ("cell", "task", "k", "kept", "lost", "new"),
    "comparison": ("cell", "task", "k", "jaccard", "lo", "hi", "bar", "self_overlap", "chance",
                   "replicates", "decision", "reason", "spearman", "metric_change", "metric_lo", "metric_hi",
                   "original_heads", "variant_heads"),
    "pathway": ("model_key", "cell", "replicate", "dataset", "estimate", "se", "df", "lo", "hi", "decision",
                "s1_replicates", "questions", "s1_status", "s1_run"),
    "pathway_note": ("model_key", "cell", "replicate", "note"),
    "pathway_comparison": ("cell", "dataset", "estimate", "lo", "hi", "decision", "replicates", "original",
                           "original_lo", "original_hi", "original_decision", "decisive"),
}

SPLITS = 200  # random half-splits for the self-overlap
K_MAX = 30  # the overlap curves run k = 1 .. this (or to the claim's k, where larger)


# --- reading the tables -----------------------------------------------------------------------------------------

def _setting(config, name: str, default=None):
    if isinstance(config, dict):
        value = config.get(name)
    else:
        value = getattr(config, name, None)
    return default if value is None else value


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


def _cells(models: pd.DataFrame) -> dict[str, list[str]]:
    """cell -> its model keys in replicate order (the original excluded)."""
    variants = models[models["cell"] != "original"].drop_duplicates("model_key")
    return {str(c): list(sub.sort_values("replicate")["model_key"]) for c, sub in variants.groupby("cell", sort=False)}


# --- overlap ------------------------------------------------------------------------------------------------------

def top_masks(per: np.ndarray, weights: np.ndarray, k: int) -> np.ndarray:
    """(draws, heads) bool: each draw's top-k heads by |weighted mean score| (`weights`: (draws, prompts))."""
    means = np.abs(weights @ per)
    k = max(1, min(k, per.shape[1]))
    idx = np.argpartition(-means, k - 1, axis=1)[:, :k]
    mask = np.zeros(means.shape, dtype=bool)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask


def jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    inter, union = (a & b).sum(-1), (a | b).sum(-1)
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def spearman_union(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Spearman's rho of two mean-score vectors over the union of their top-k heads (by |score|)."""
    from scipy.stats import spearmanr

    ones = np.ones((1, 1))
    union = top_masks(x[None], ones, k)[0] | top_masks(y[None], ones, k)[0]
    a, b = x[union], y[union]
    if union.sum() < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b)[0])


def self_overlap(per: np.ndarray, k: int, seed: int, splits: int = SPLITS) -> np.ndarray:
    """The original's top-k on one half of the prompt pairs against its top-k on the other half, per random split."""
    n = per.shape[0]
    rng = np.random.default_rng(seed)
    half = n // 2
    w_a, w_b = np.zeros((splits, n)), np.zeros((splits, n))
    for s in range(splits):
        perm = rng.permutation(n)
        w_a[s, perm[:half]], w_b[s, perm[half:2 * half]] = 1.0, 1.0
    return jaccard(top_masks(per, w_a, k), top_masks(per, w_b, k))


def chance(k: int, total: int) -> float:
    """The expected Jaccard of two random k-sets of `total` heads (k^2/N shared of 2k - k^2/N)."""
    k = min(k, total)
    return float(k / (2 * total - k)) if total else float("nan")


def circuit_k(model_row, min_k: int) -> int:
    return config_circuit_k(float(model_row["heads_needed"]), int(model_row["total_heads"]), min_k)


# --- derived tables -----------------------------------------------------------------------------------------------

def derive(table: pd.DataFrame, config) -> pd.DataFrame:
    """Add curve rows (explained effect per model and task), the overlap curves over k (each variant replicate with the
    original; the original's split-half reference; replicate against replicate within a cell), the heads kept, lost
    and new at the claim's k, and the comparison tables (claims_of)."""
    seed = int(_setting(config, "seed", 0))
    min_k = int(_setting(config, "min_k", 5))
    models = table[table["kind"] == "model"]
    per = attributions(table)
    rows = _curve_rows(table[table["kind"] == "per_prompt"])
    for task in dict.fromkeys(models["task"]):
        rows += _overlap_rows(models, per, task, seed, min_k)
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
        del row["_group"]
    pathways = [_pathway_row(c) for c in claims if c.name == "keeps the pathway"]
    return pd.concat([out, pd.DataFrame(comparison), pd.DataFrame(pathways)], ignore_index=True)


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


def _overlap_rows(models: pd.DataFrame, per: dict, task: str, seed: int, min_k: int) -> list[dict]:
    """One task's overlap curves over k: the original's split-half reference, each variant replicate against the
    original, replicate against replicate within a cell; and each cell's heads kept, lost and new."""
    orig_row = models[(models["model_key"] == "original") & (models["task"] == task)]
    if orig_row.empty or ("original", task) not in per:
        return []
    orig_row = orig_row.iloc[0]
    a = per[("original", task)]
    total = a.shape[1]
    k_claim = circuit_k(orig_row, min_k)
    ks = list(range(1, min(max(K_MAX, k_claim), total) + 1))
    ones = np.ones((1, a.shape[0])) / a.shape[0]
    rows = []
    for k in ks:
        ref = self_overlap(a, k, seed)
        rows.append({"kind": "reference", "task": task, "k": k, "value": float(ref.mean()),
                     "lo": float(np.percentile(ref, 2.5)), "hi": float(np.percentile(ref, 97.5)),
                     "chance": chance(k, total)})
    mean_a = a.mean(0)
    for cell, keys in _cells(models).items():
        keys = [key for key in keys if (key, task) in per]
        for key in keys:
            b = per[(key, task)]
            rep = int(models[models["model_key"] == key]["replicate"].iloc[0])
            rows += [{"kind": "overlap", "cell": cell, "replicate": rep, "task": task, "k": k,
                      "jaccard": float(jaccard(top_masks(a, ones, k), top_masks(b, ones, k))[0]),
                      "spearman": spearman_union(mean_a, b.mean(0), k)} for k in ks]
        for k in ks if len(keys) > 1 else []:
            pairs = [float(jaccard(top_masks(per[(x, task)], ones, k), top_masks(per[(y, task)], ones, k))[0])
                     for i, x in enumerate(keys) for y in keys[i + 1:]]
            rows.append({"kind": "replicate_overlap", "cell": cell, "task": task, "k": k, "value": float(np.mean(pairs)),
                         "lo": float(np.min(pairs)), "hi": float(np.max(pairs))})
        if keys:
            rows.append(_heads_row(cell, task, k_claim, a, [per[(key, task)] for key in keys], int(orig_row["n_heads"])))
    return rows


def _pathway_row(c) -> dict:
    low, high = c.interval()
    return {"kind": "pathway_comparison", "cell": c.group.partition(" / ")[0], "dataset": c.group.partition(" / ")[2],
            "estimate": c.estimate, "lo": low, "hi": high, "decision": c.decision, "replicates": c.replicates,
            "decisive": not c.reported, **c.extra}


def _name(index: int, n_heads: int) -> str:
    return f"L{index // n_heads}.H{index % n_heads}"


def _heads_row(cell: str, task: str, k: int, a: np.ndarray, reps: list[np.ndarray], n_heads: int) -> dict:
    """The original's top-k heads the variant keeps in its own top-k (in how many replicates), those it loses, and the
    heads new to its top-k; named L{layer}.H{head}."""
    ones = np.ones((1, a.shape[0])) / a.shape[0]
    orig = top_masks(a, ones, k)[0]
    masks = [top_masks(b, ones, k)[0] for b in reps]
    kept_count = np.sum([m & orig for m in masks], axis=0) if masks else np.zeros_like(orig, dtype=int)
    new_count = np.sum([m & ~orig for m in masks], axis=0) if masks else np.zeros_like(orig, dtype=int)
    n = max(len(masks), 1)
    order = np.argsort(-np.abs(a.mean(0)))

    def names(selected, counts=None):
        return ", ".join(_name(i, n_heads) + (f" ({counts[i]}/{n})" if counts is not None and n > 1 else "")
                         for i in order if selected[i])
    return {"kind": "heads", "cell": cell, "task": task, "k": k, "kept": names(kept_count > 0, kept_count),
            "lost": names(orig & (kept_count == 0)), "new": names(new_count > 0, new_count)}


def _comparison_row(c) -> dict:
    low, high = c.interval()
    return {"kind": "comparison", "_group": c.group, "cell": c.group.partition(" / ")[0],
            "task": c.group.partition(" / ")[2], "k": c.extra["k"], "jaccard": c.estimate, "lo": low, "hi": high,
            "bar": c.bar.value, "self_overlap": c.extra["self_overlap"], "chance": c.extra["chance"],
            "replicate_overlap": c.extra["replicate_overlap"], "replicates": c.replicates, "decision": c.decision,
            "reason": c.reason, "original_heads": c.extra["original_heads"], "variant_heads": c.extra["variant_heads"]}


# --- claims -------------------------------------------------------------------------------------------------------

def claims_of(table: pd.DataFrame, config):
    """Per variant cell and task: keeps the circuit (decisive), rank correlation and the task metric's change
    (reported); each decided (Bonferroni over the decisive ones for "no"). Returns (claims, gates)."""
    seed = int(_setting(config, "seed", 0))
    min_k = int(_setting(config, "min_k", 5))
    min_verify = float(_setting(config, "min_verify", 0.5))
    models = table[table["kind"] == "model"]
    per, metric = attributions(table), clean_metrics(table)
    replicate_overlap = table[table["kind"] == "replicate_overlap"] if "kind" in table else table.iloc[:0]
    claims = []
    for task in dict.fromkeys(models["task"]):
        orig = models[(models["model_key"] == "original") & (models["task"] == task)]
        if orig.empty or ("original", task) not in per:
            continue
        orig = orig.iloc[0]
        a = per[("original", task)]
        n, total = a.shape
        k = circuit_k(orig, min_k)
        ref = float(self_overlap(a, k, seed).mean())
        luck = chance(k, total)
        bar = (ref + luck) / 2
        for cell, keys in _cells(models[models["task"] == task]).items():
            keys = [key for key in keys if (key, task) in per]
            if not keys:
                continue
            sampler = Resampler(n, len(keys), n_boot=1000, seed=seed)
            rows = models[(models["task"] == task) & models["model_key"].isin(keys)]

            def overlap(r, weights, keys=keys):
                return jaccard(top_masks(a, weights, k), top_masks(per[(keys[r], task)], weights, k))
            group = f"{cell} / {task}"
            c = declared(CLAIMS, "keeps the circuit").attach(sampler.weighted_claim(
                "keeps the circuit", overlap, Bar(">=", bar), group=group, n_unit="prompt pairs"))
            held = _held_open(orig, rows, min_verify)
            if held:
                c.ceiling = held
            rep_rows = replicate_overlap[(replicate_overlap["cell"] == cell) & (replicate_overlap["task"] == task)
                                         & (replicate_overlap["k"] == k)] if len(replicate_overlap) else []
            c.extra = {"k": k, "self_overlap": ref, "chance": luck,
                       "replicate_overlap": float(rep_rows["value"].iloc[0]) if len(rep_rows) else float("nan"),
                       "original_heads": float(orig["heads_needed"]),
                       "variant_heads": float(rows["heads_needed"].mean())}
            claims.append(c)
            claims.append(declared(CLAIMS, "rank correlation").attach(sampler.claim(
                "rank correlation", lambda r, idx, keys=keys: spearman_union(a[idx].mean(0),
                                                                             per[(keys[r], task)][idx].mean(0), k)
                if len(idx) else float("nan"), Bar(">=", 0.0), group=group, n_unit="prompt pairs", reported=True)))
            if ("original", task) in metric and all((key, task) in metric for key in keys):
                diff = np.stack([metric[(key, task)] - metric[("original", task)] for key in keys])
                claims.append(declared(CLAIMS, "task metric change").attach(sampler.mean_claim(
                    "task metric change", diff, Bar(">=", 0.0), group=group, n_unit="prompt pairs", reported=True)))
    from lmlab.studies.compare.pathways import pathway_claims

    claims += pathway_claims(table, declared(CLAIMS, "keeps the pathway"))
    decisive = [c for c in claims if not c.reported]
    m = max(len(decisive), 1)
    for c in claims:
        c.decide(1 - 0.05 / m if not c.reported else 0.95)
    return claims, []


def _held_open(orig, rows: pd.DataFrame, min_verify: float) -> str:
    """Why a task's comparison cannot decide (the original has no effect; a ranking not confirmed by activation
    patching), or ""."""
    if not bool(orig["has_effect"]):
        return "the original shows no effect on this task to explain (clean metric = every head patched)"
    checked = [("the original", orig["verify_rho"])] + [(f"replicate {int(r.replicate)}", r.verify_rho)
                                                       for r in rows.itertuples()]
    weak = [(who, rho) for who, rho in checked if np.isfinite(rho) and rho < min_verify]
    if weak:
        return ("attribution does not track activation patching on the top heads of "
                + ", ".join(f"{who} (Spearman {rho:.2f})" for who, rho in weak)
                + f", below {min_verify:g}: its ranking cannot be compared")
    return ""


ANSWER = {"yes": "keeps", "no": "does not keep", "open": "open"}
SAYS = {"yes": "keeps the circuit", "no": "does not keep the circuit", "open": "cannot tell yet"}


def verdict(result) -> Verdict:
    claims, gates = claims_of(_stacked(result), result.config)
    seconds = float(getattr(result, "seconds", 0.0) or 0.0)
    status, _ = judge(claims, gates, seconds=seconds)
    keeps = [c for c in claims if c.name == "keeps the circuit"]
    lines = []
    for c in keeps:
        low, high = c.interval()
        lines.append(f"{c.group}: {SAYS[c.decision]} (top-{c.extra['k']} Jaccard {c.estimate:.2f} "
                     f"[{low:.2f}, {high:.2f}] over {c.replicates} replicate(s) x {c.n} prompt pairs; bar "
                     f"{c.bar.value:.2f} = midway between the original's split-half self-overlap "
                     f"{c.extra['self_overlap']:.2f} and chance {c.extra['chance']:.2f}"
                     + (f"; replicate-to-replicate {c.extra['replicate_overlap']:.2f}"
                        if np.isfinite(c.extra["replicate_overlap"]) else "")
                     + (f"; open: {c.reason}" if c.decision == "open" and c.reason else "") + ")")
    for c in claims:
        if c.name != "keeps the pathway":
            continue
        low, high = c.interval()
        o = c.extra
        lines.append(f"{c.group}: " + ({"yes": "keeps the question-anchored pathway", "no": "does not keep the "
                                        "question-anchored pathway", "open": "cannot tell yet whether it keeps the "
                                        "question-anchored pathway"}[c.decision] if not c.reported else
                                       "the original shows no question-anchored pathway here to keep")
                     + f" (E_Q ΔP - control ΔP {c.estimate:+.1f} pp [{low:+.1f}, {high:+.1f}] over {c.replicates} "
                       f"replicate model(s); the original's {o['original']:+.1f} pp [{o['original_lo']:+.1f}, "
                       f"{o['original_hi']:+.1f}], {o['original_decision']})")
    notes = result.table("pathway_note")
    lines += [f"{r.cell} (replicate {int(r.replicate)}): no pathway to compare ({r.note})" for r in notes.itertuples()]
    counts = {d: sum(c.decision == d for c in keeps) for d in ("yes", "no", "open")}
    head = (f"{counts['yes']} of {len(keeps)} comparisons keep the original's circuit, {counts['no']} do not, "
            f"{counts['open']} open. ") if keeps else "no comparison could be made. "
    summary = (head + "; ".join(lines) + ". No paper claims this: the status stays inconclusive by lmlab's rule (only a "
               "paper's claim reproduces or fails); the answers above are lmlab's, per variant and task")
    scope = f"this run: {result.models[0] if result.models else 'the model'} against its variants"
    found = evidence(claims, gates, scope=scope)
    if keeps:  # what decides here is the answer for each variant, not one claim: the line the report heads with
        found["deciding"] = {"status": status, "kind": "claim", "name": "each variant's circuits", "source": "lmlab",
                             "where": "no paper claims this; the rule: " + declared(CLAIMS, "keeps the circuit").bar,
                             "bar": "(R + C) / 2", "bar_note": "", "decision": "", "line": answers(keeps),
                             "text": answers(keeps)}
    return Verdict(status=status, claim="Each variant keeps the original's circuit on each task (lmlab's question)",
                   summary=summary, evidence=found)


def answers(keeps) -> str:
    """One line: per variant cell, its answer on each task with the overlap's interval."""
    cells: dict[str, list[str]] = {}
    for c in keeps:
        cell, _, task = c.group.partition(" / ")
        low, high = c.interval()
        cells.setdefault(cell, []).append(f"{task} {ANSWER[c.decision]} ({c.estimate:.2f} [{low:.2f}, {high:.2f}] "
                                          f"vs {c.bar.value:.2f})")
    return "top-k Jaccard with the original against its bar: " + "; ".join(
        f"{cell}: {', '.join(parts)}" for cell, parts in cells.items())


def _stacked(result) -> pd.DataFrame:
    """The tables the claims read, stacked with their kind."""
    parts = [result.table(name).assign(kind=name) for name in ("model", "attribution", "per_prompt",
                                                               "replicate_overlap", "pathway", "pathway_note")]
    return pd.concat([p for p in parts if len(p)], ignore_index=True)


def summary(result) -> pd.DataFrame:
    """One row per variant cell and task: the answer, the overlap with its interval and bar, the circuit sizes."""
    table = result.table("comparison")
    if table.empty:
        return table
    out = pd.DataFrame({
        "variant": table["cell"], "task": table["task"],
        "keeps circuit": table["decision"].map(ANSWER),
        "top-k": table["k"].astype(int),
        "Jaccard [95%]": [f"{j:.2f} [{lo:.2f}, {hi:.2f}]" for j, lo, hi in zip(table["jaccard"], table["lo"],
                                                                              table["hi"])],
        "bar": table["bar"].round(2), "self-overlap": table["self_overlap"].round(2),
        "replicates": table["replicates"].astype(int),
        "heads@0.9 orig/var": [f"{_n(a)}/{_n(b)}" for a, b in zip(table["original_heads"], table["variant_heads"])],
        "metric change": table["metric_change"].round(3)})
    paths = result.table("pathway_comparison")
    if len(paths):
        out = pd.concat([out, pd.DataFrame({
            "variant": paths["cell"], "task": "pathway: " + paths["dataset"].astype(str),
            "keeps circuit": [ANSWER[d] if k else "nothing to keep" for d, k in zip(paths["decision"],
                                                                                   paths["decisive"])],
            "E_Q - control, pp [95%]": [f"{e:+.1f} [{lo:+.1f}, {hi:+.1f}]" for e, lo, hi in
                                        zip(paths["estimate"], paths["lo"], paths["hi"])],
            "original, pp": paths["original"].round(1), "replicates": paths["replicates"].astype(int)})],
            ignore_index=True)
    return out


def _n(x) -> str:
    return "-" if not np.isfinite(x) else f"{x:.0f}"


# --- figure -------------------------------------------------------------------------------------------------------

COLORS = ["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]


def figure(result, fig=None):
    """Per task, one row: (1) each head's mean attribution, original (x) against each variant (y; replicates pooled),
    the original's top heads named; (2) the top-k overlap with the original against k, each variant's mean over its
    replicates (band: lowest to highest), the original's split-half self-overlap (grey band), chance (dotted) and the
    bar at the claim's k (a marker); (3) the explained-effect curves on one axis (each model along its own ranking)."""
    models = result.table("model")
    tasks = list(dict.fromkeys(models["task"])) if len(models) else []
    fig, axes = canvas(fig, (15, 3.8 * max(len(tasks), 1)), max(len(tasks), 1), 3, squeeze=False)
    if not tasks:
        return finish(fig)
    per = attributions(result.table("attribution").assign(kind="attribution"))
    cells = list(_cells(models))
    color = {c: COLORS[i % len(COLORS)] for i, c in enumerate(cells)}
    for row, task in zip(axes, tasks):
        _scatter_panel(row[0], models, per, task, cells, color)
        _overlap_panel(row[1], result, task, cells, color)
        _curve_panel(row[2], result.table("curve"), task, color)
    fig.suptitle(f"{result.models[0] if result.models else ''}: does each variant keep the original's circuits? "
                 "(lmlab's comparison; no paper claims this)", fontsize=10)
    return finish(fig)


def _scatter_panel(ax, models, per, task, cells, color) -> None:
    a = per.get(("original", task))
    n_heads = int(models[(models["model_key"] == "original") & (models["task"] == task)].iloc[0]["n_heads"])
    if a is not None:
        x = a.mean(0)
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
    ax.set_title(f"{task}: head attribution")
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
        piv = sub.pivot_table(index="k", columns="replicate", values="jaccard")
        ax.plot(piv.index, piv.mean(axis=1), color=color[cell], lw=1.8, label=f"{cell} vs original")
        if piv.shape[1] > 1:
            ax.fill_between(piv.index, piv.min(axis=1), piv.max(axis=1), color=color[cell], alpha=0.15, linewidth=0)
        rr = rep_overlap[(rep_overlap["cell"] == cell) & (rep_overlap["task"] == task)] if len(rep_overlap) else []
        if len(rr):
            ax.plot(rr["k"], rr["value"], color=color[cell], lw=0.9, ls="--", label=f"{cell}, replicate vs replicate")
        comp = comparison[(comparison["cell"] == cell) & (comparison["task"] == task)] if len(comparison) else []
        if len(comp):
            c = comp.iloc[0]
            ax.errorbar([c["k"]], [c["jaccard"]], yerr=[[c["jaccard"] - c["lo"]], [c["hi"] - c["jaccard"]]],
                        color=color[cell], fmt="o", capsize=3)
            ax.plot([c["k"] - 0.6, c["k"] + 0.6], [c["bar"]] * 2, color="black", lw=2)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("k (top heads)")
    ax.set_ylabel("Jaccard overlap of the top-k")
    ax.set_title(f"{task}: overlap with the original (bar: black tick)")
    ax.legend(fontsize=6, loc="lower right")


def _curve_panel(ax, curves, task, color) -> None:
    for key, sub in curves[curves["task"] == task].groupby("model_key", sort=False):
        cell = str(sub["cell"].iloc[0])
        sub = sub.sort_values("n_heads")
        first = cell == "original"
        ax.plot(sub["n_heads"], sub["value"], color="tab:blue" if first else color.get(cell, "k"),
                lw=2.2 if first else 1.0, ls="-" if first else "--", zorder=1 if first else 2,
                label=cell if key.endswith("#0") or first else None)
    ax.axhline(0.9, color="grey", ls=":", lw=1)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=0)
    ax.set_ylim(-0.1, 1.15)
    ax.set_xlabel("heads kept (each model's own ranking)")
    ax.set_ylabel("explained effect")
    ax.set_title(f"{task}: explained effect")
    ax.legend(fontsize=7, loc="lower right")
