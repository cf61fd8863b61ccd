"""sparse-circuits' derived tables, figures, verdict and the report's key rows, read from the result's tables (and
the toy's edge usage the run saved beside them); `derive` turns the per-prompt curves into explained effect with
intervals, heads needed and the multiplier, when a run finishes and again when it is re-judged; `figures` draws the
toy's edges and the post-training trajectories beside the main figure.

Whose verdict: the paper's claims are on the model (GPT-2 and OLMo-7B in the paper; here the given model), so a run
with the model's circuits is judged by that half (circuit_analysis.py); the addition toy (the paper's Figure 1
setting, toy/analysis.py) carries claims of ours only, shown beside the model's and never deciding (`with_toy`).
A run of the toy alone (the demo) is judged by the toy's claims, which being ours can hold the verdict at
inconclusive but never make it "reproduced" or "not reproduced". Where the paper and our reading differ, the
paper wins: the paper reports the multiplier as a point per task; its interval here, with the heads re-ranked on
every resample of the prompt pairs (resample.py), is ours.

The placebo (`--placebo`: the post-training's edge term at weight zero, recipe.py) is judged by the same claims;
the runner marks its verdict as the placebo's."""

from __future__ import annotations


import numpy as np
import pandas as pd

from lmlab.studies.verdict import Verdict
from lmlab.studies.sparse_circuits.declared import CLAIMS, COLUMNS  # noqa: F401  (the claims, whose each is and why; the tables' columns)
from lmlab.studies.sparse_circuits import circuit_analysis
from lmlab.studies.sparse_circuits.circuit_analysis import model_figure, model_verdict
from lmlab.studies.sparse_circuits.toy.model import POSITION_NAMES
from lmlab.studies.sparse_circuits.toy.analysis import toy_seed_figure, toy_verdict

# the tables `derive` makes from the measurements (made again, never kept, when a run is re-judged)
DERIVED = ("curve", "heads_needed", "multiplier")


def derive(frame: pd.DataFrame, config) -> pd.DataFrame:
    """The measurements with the circuit tables derived from them (circuit_analysis.derive at the config's threshold
    and seed); rows of a derived kind already in `frame` are replaced. The toy alone derives nothing."""
    if frame.empty:
        return frame
    frame = frame[~frame["kind"].isin(DERIVED)].reset_index(drop=True)
    if not (frame["kind"] == "per_prompt").any():
        return frame
    return circuit_analysis.derive(frame, config.threshold, config.seed)


def figures(result) -> dict:
    """Beside the main figure: the toy's attention edges (where the run saved their usage) and the post-training
    trajectories."""
    out = {}
    usage = result.path / "toy_edges.safetensors" if result.path is not None else None
    if usage is not None and usage.is_file():
        from safetensors.torch import load_file

        edges = load_file(str(usage))
        out["toy_figure"] = toy_figure(edges["dense"].numpy(), edges["sparse"].numpy())
    out["geco_figure"] = geco_figure(result.tables)
    return out


def figure(result, fig=None):
    if result.table("curve").empty and len(result.table("toy")):
        return toy_seed_figure(result, fig)
    return model_figure(result, fig)


def toy_figure(dense: np.ndarray, sparse: np.ndarray, window: int = len(POSITION_NAMES)):
    """Attention edges per layer of the addition toy, on the first problem's window (bos + 9 tokens) of each
    sequence: dense above, sparse below (widths = mean weight); titles count edges over whole sequences."""
    import matplotlib.pyplot as plt

    n_layers = dense.shape[0]
    fig, axes = plt.subplots(2, n_layers, figsize=(3.2 * n_layers, 5.6), squeeze=False)
    for row, (usage, name) in enumerate(((dense, "dense"), (sparse, "sparse"))):
        for layer in range(n_layers):
            ax = axes[row][layer]
            full = usage.shape[-1]
            n = min(window, full)
            weights = usage[layer].sum(0)[:n, :n]  # summed over heads: (query, key)
            kept = int((usage[layer] > 1e-6).sum())
            total = usage.shape[1] * full * (full + 1) // 2
            for q in range(n):
                for k in range(q + 1):
                    w = float(weights[q, k]) / usage.shape[1]
                    if w > 1e-3:
                        ax.plot([k, q], [0, 1], color="tab:blue" if row == 0 else "tab:orange",
                                alpha=min(1.0, 0.15 + w), linewidth=0.3 + 3 * w)
            ax.scatter(range(n), [0] * n, s=12, color="black", zorder=3)
            ax.scatter(range(n), [1] * n, s=12, color="black", zorder=3)
            ax.set_xticks(range(n), POSITION_NAMES[:n], fontsize=7)
            ax.set_yticks([])
            ax.set_ylim(-0.15, 1.15)
            ax.set_title(f"{name}, layer {layer}: {100 * kept / total:.1f}% of edges used", fontsize=9)
    fig.suptitle("2-digit addition toy: attention edges of the first problem in each sequence, 200 test sequences "
                 "(key below, query above; width = mean weight), dense vs sparse", fontsize=10)
    fig.tight_layout()
    return fig


CLAIM = ("At equal explained effect the sparse model needs fewer heads (multiplier > 1) on most tasks, and its "
         "attention keeps a few per cent of edges or fewer at unchanged loss.")


def verdict(result) -> Verdict:
    mult, sparsity = result.table("multiplier"), result.table("sparsity")
    toy_claim = CLAIM.split(", and ")[-1].rstrip(".")
    if mult.empty and sparsity.empty and len(result.table("toy")):
        return toy_verdict(result, toy_claim, getattr(result, "seconds", 0.0))
    if mult.empty or sparsity.empty:
        return Verdict(status="inconclusive", claim=CLAIM,
                       parts=[{"kind": "missing_rows", "rows": "multiplier or sparsity"}])
    model = model_verdict(result, CLAIM)
    if not len(result.table("toy")):
        return model
    return with_toy(model, toy_verdict(result, toy_claim, model_run=True))


def with_toy(model: Verdict, toy: Verdict) -> Verdict:
    """A run with both halves (the model's circuits and the addition toy): the study's verdict is the model half's.
    The toy illustrates the paper (its Figure 1) but the paper's numbers are on GPT-2 and OLMo-7B, so every toy claim
    is ours and the toy's own verdict is shown beside the model's, never deciding the study's: a toy "no" is not the
    paper's "not reproduced", and a toy "yes" cannot lift the model's. Both halves' claims and gates are kept, the
    toy's marked reported, so the report draws them all; the toy's numbers sit under `toy`."""
    toy_claims = [{**c, "reported": True} for c in toy.evidence.get("claims", [])]
    toy_gates = [{**g, "blocks": "none"} for g in toy.evidence.get("gates", [])]
    lists = {"claims": model.evidence.get("claims", []) + toy_claims,
             "gates": model.evidence.get("gates", []) + toy_gates}
    numbers = {k: v for k, v in toy.evidence.items() if k not in ("claims", "gates", "schema")}
    parts = [{"kind": "with_toy", "model": {"status": model.status, "parts": model.parts},
              "toy": {"status": toy.status, "parts": toy.parts}}]
    return Verdict(status=model.status, claim=CLAIM, parts=parts,
                   evidence={**model.evidence, **lists, "deciding": model.evidence.get("deciding"),
                             "toy": {**numbers, "status": toy.status}})


def geco_figure(tables: dict[str, pd.DataFrame]):
    """Post-training trajectories from the run's tables (name -> table): the constraint (CE over its bound) and its
    moving average, lambda, edges kept."""
    import matplotlib.pyplot as plt

    parts = [(k, tables[k]) for k in ("geco", "toy_geco") if len(tables.get(k, ()))]
    fig, axes = plt.subplots(len(parts) or 1, 3, figsize=(12, 3.2 * max(len(parts), 1)), squeeze=False)
    for row, (kind, table) in zip(axes, parts):
        name = "SmolLM2 / model" if kind == "geco" else "addition toy"
        groups = table.groupby("replicate") if "replicate" in table else [(0, table)]
        for i, (rep, t) in enumerate(groups):
            t = t.sort_values("step")
            color = f"C{i}"
            row[0].plot(t["step"], t["ce"] - t["tau"], color=color, alpha=0.35, lw=0.8)
            row[0].plot(t["step"], t["ema"], color=color, lw=1.5, label=f"replicate {rep}: moving average")
            row[1].semilogy(t["step"], t["multiplier"], color=color, label=f"replicate {rep}")
            if t["kept_edges"].notna().any():
                row[2].plot(t["step"], 100 * t["kept_edges"], color=color, label=f"replicate {rep}")
        row[0].axhline(0.0, color="grey", linestyle=":", label="bound")
        row[0].set_title(f"{name}: constraint (nats over tau; faint: each batch)", fontsize=9)
        row[0].legend(fontsize=6)
        row[1].set_title("GECO multiplier lambda", fontsize=9)
        row[2].set_title("edges kept in training (%, sampled gate)", fontsize=9)
        for ax in row:
            ax.set_xlabel("step")
    fig.tight_layout()
    return fig


def report_rows(result) -> pd.DataFrame:
    rows = []
    tasks = result.table("task")
    needed = result.table("heads_needed")
    mult = result.table("multiplier")
    mult = mult.set_index("task") if "task" in mult else mult
    for name in dict.fromkeys(tasks["task"] if "task" in tasks else []):
        row = {"task": name}
        for variant in ("dense", "sparse"):
            t = tasks[(tasks["task"] == name) & (tasks["variant"] == variant)]
            h = needed[(needed["task"] == name) & (needed["variant"] == variant)]
            if not t.empty:
                row[f"{variant} metric"] = round(float(t["clean_metric"].mean()), 3)
                row[f"{variant} acc"] = round(float(t["accuracy"].mean()), 3)
            if not h.empty:  # the sparse model: one per replicate
                row[f"{variant} heads@0.9"] = ", ".join("-" if pd.isna(v) else f"{v:.0f}" for v in h["value"])
        if name in mult.index:
            values = mult.loc[[name], "value"]
            row["multiplier"] = ", ".join(f"{v:.2f}x" for v in values)
        rows.append(row)
    for r in result.table("sparsity").itertuples():
        if r.variant == "dense" and getattr(r, "replicate", 0) not in (0, None):
            continue  # the dense model's row repeats per replicate
        epq = getattr(r, "edges_per_query", np.nan)
        rep = f", replicate {int(r.replicate)}" if r.variant == "sparse" and hasattr(r, "replicate") else ""
        rows.append({"task": f"held-out text ({r.variant}{rep})", "dense metric": None,
                     "multiplier": f"edges kept {100 * r.value:.2f}%"
                                   + (f" ({epq:.2f} per query)" if not pd.isna(epq) else "") + f", CE {r.ce:.3f}"})
    for r in result.table("toy").itertuples():
        epq = getattr(r, "edges_per_query", np.nan)
        rows.append({"task": f"addition toy ({r.variant}" + (f", replicate {r.replicate})" if hasattr(r, "replicate") else ")"),
                     "multiplier": f"exact match {100 * r.value:.1f}%, edges kept {100 * r.kept:.1f}%"
                                   + (f" ({epq:.2f} per query)" if not pd.isna(epq) else "")})
    return pd.DataFrame(rows)
