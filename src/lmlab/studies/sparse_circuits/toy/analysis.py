"""S4 on the addition toy: the paper's figure at toy scale and the toy's claims, read from the tables alone.

Every toy claim is ours (declared.py): the paper draws the toy's sparse graph (its Figure 1) but measures sparsity and
circuits on GPT-2 and OLMo-7B, so the toy alone never makes the study "reproduced" or "not reproduced" (its verdict
is inconclusive, its claims say what they say), and beside the model's half it is shown, never deciding
(analysis.with_toy). Claims (lmlab.claims; each an estimate over the k replicates with an interval over replicates
and items):
- edges kept <= 5% ("a few per cent or fewer"): the deterministic gate's kept share of causal edges, per test
  sequence (items: the 200 test sequences);
- unchanged loss: exact match, sparse minus dense, >= -2 points (items: the same sequences, paired), reported: a
  post-training that does not sparsify (the placebo) keeps it by construction; the held-out loss gate holds the loss;
- fewer heads: log2 of the multiplier (heads the dense toy needs for 0.9 explained effect / heads the sparse
  toy needs), its mean over the toy's circuit tasks (config.TOY_TASKS: by default the sum's tens digit and the carry
  into it, whose dense circuits need several heads) >= 0 with the interval clear of 0; each task's own is reported
  (items: each task's prompt pairs, resampled with the heads ranked again on each draw: resample.py).
Gates: the dense toys learned addition (exact match >= 90% each), every measured sparse toy at unchanged loss (its
held-out answer CE, deterministic gate, at most its dense toy's plus the slack: the constraint read on the model whose
edges and circuits are counted, `held_out_loss_gate`), and more than one replicate. A replicate that fails either of
the first two is a failed replicate: left out of every claim's estimate and counted at its worst (lmlab.claims), so
each of those gates blocks every decision only where fewer than two replicates are left. Every
sparse post-training held its constraint over the last quarter of its steps (the sampled gate's training CE, its
mean excess over its bound there at most a tenth of the slack, as `constraint_held` reads it) and its kept edges
settled (no longer falling by more than 10% over the last quarter): each blocks "not reproduced" only
(`post_training_gates` says why).

DECISION (the constraint's two readings): GECO holds the sampled gate's training CE at its bound by oscillating about
it, so where the last quarter falls in that swing can fail the trace's reading on a replicate whose final sparse
model kept its loss. Our rule that "a run whose constraint is still violated at the end has not converged" stands
for "not reproduced" (a GECO still pulling the CE down would give edges back); a sparsity shown at the measured
model's unchanged loss stands.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd

from lmlab.claims import Gate, declared, evidence, judge, replicates_gate
from lmlab.render.summary import judgement_part, part_text
from lmlab.resampling import Resampler
from lmlab.studies.figures import canvas, finish
from lmlab.studies.verdict import Verdict
from lmlab import circuits
from lmlab.studies.sparse_circuits.config import TOY_TASKS
from lmlab.studies.sparse_circuits.declared import CLAIMS, EDGES_LIMIT, THRESHOLD
from lmlab.studies.sparse_circuits.gates import NO_EFFECT, held_out_loss_gate, no_effect_gate, post_training_gates
from lmlab.studies.sparse_circuits.resample import needed_per_unit, paired, reranked_claim, reranked_gate

TOY_LEARNED = 0.90  # the dense toy must have learned addition before its sparse version can say anything
FULL_SPARSE_STEPS = 2000  # the full profile's post-training of the model (profiles.yaml)


def replicates_of(table: pd.DataFrame) -> list[int]:
    return sorted(int(r) for r in table["replicate"].unique()) if "replicate" in table else [0]


def curves(result) -> dict[tuple[str, int, str], circuits.EffectCurve]:
    """(toy task, replicate, variant) -> the explained-effect curve with its per-prompt values (a record from before
    the toy had several tasks holds the ones digit's)."""
    pp = result.table("toy_per_prompt")
    if len(pp):
        pp = pp.assign(task=pp["task"].fillna("ones") if "task" in pp else "ones")
    out = {}
    for (task, r, variant), part in pp.groupby(["task", "replicate", "variant"]) if len(pp) else ():
        part = part.sort_values("n_heads")
        values = np.array([json.loads(v) for v in part["values"]])
        out[(str(task), int(r), str(variant))] = circuits.EffectCurve([int(n) for n in part["n_heads"]], values,
                                                                      values[-1], values[0])
    return out


def _multiplier_claims(found: dict, reps: list[int], seed: int, units: dict) -> tuple[list, Gate | None]:
    """log2 (dense heads / sparse heads at THRESHOLD) per toy task (reported) and over the tasks (decisive, ours),
    over each task's prompt pairs and the replicates: the estimate with the heads ranked on every pair, the interval's
    item level from the draws the recipe measured with the heads ranked again on each (`units`, resample.py; a
    record without them resamples the pairs under the fixed ranking, and the gate it returns says so)."""
    tasks = sorted({t for t, _, _ in found}, key=list(TOY_TASKS).index)
    if not tasks or not all((t, r, v) in found for t in tasks for r in reps for v in ("dense", "sparse")):
        return [], None
    n_prompts = min(found[(t, reps[0], "dense")].values.shape[1] for t in tasks)

    def log_multiplier(task: str):
        def stat(i: int, idx: np.ndarray) -> float:
            total = found[(task, reps[i], "dense")].grid[-1]
            d = found[(task, reps[i], "dense")].heads_needed(THRESHOLD, idx)
            s = found[(task, reps[i], "sparse")].heads_needed(THRESHOLD, idx)
            return float(np.log2(max(total if d is None else d, 1) / max(total if s is None else s, 1)))
        return stat

    stats = {t: log_multiplier(t) for t in tasks}
    name = "log2 multiplier (dense heads / sparse heads at 0.9)"
    mean_name = name if len(tasks) == 1 else f"mean {name} over the tasks"
    toy = declared(CLAIMS, "toy log2 multiplier")
    common = dict(n_unit="prompt pairs")
    shared = {t: paired(units, [(t, r, v) for r in reps for v in ("dense", "sparse")]) for t in tasks}
    if all(d is not None for d in shared.values()) and len({len(d) for d in shared.values()}) == 1:
        everything = np.arange(n_prompts)
        per = {t: np.array([stats[t](i, everything) for i in range(len(reps))]) for t in tasks}
        draws = {t: np.stack([np.log2(np.maximum(units[(t, r, "dense")][1], 1) /
                                      np.maximum(units[(t, r, "sparse")][1], 1)) for r in reps], axis=1)
                 for t in tasks}
        claims = [toy.measure(reranked_claim, per[t], draws[t], n_prompts, label=name, group=f"toy: {t}",
                              reported=True, **common) for t in tasks] if len(tasks) > 1 else []
        claims.append(toy.measure(reranked_claim, np.mean([per[t] for t in tasks], axis=0),
                                  np.mean([draws[t] for t in tasks], axis=0), n_prompts, label=mean_name,
                                  group="toy: " + ", ".join(tasks), **common))
        n_draws = len(next(iter(shared.values())))
        return claims, reranked_gate(True, f"{n_draws} resamples of the prompt pairs, each ranking the heads anew")
    prompts = Resampler(n_prompts, len(reps), n_boot=400, seed=seed)
    claims = [toy.measure(prompts.claim, stats[t], label=name, group=f"toy: {t}", reported=True, **common)
              for t in tasks] if len(tasks) > 1 else []
    claims.append(toy.measure(prompts.claim, lambda i, idx: float(np.mean([stats[t](i, idx) for t in tasks])),
                              label=mean_name, group="toy: " + ", ".join(tasks), **common))
    return claims, reranked_gate(False, "no re-ranked resamples recorded: the interval resamples the prompt pairs "
                                        "under the ranking fixed on all of them")


def _matrix(seq: pd.DataFrame, column: str) -> np.ndarray:
    return seq.pivot_table(index="replicate", columns="idx", values=column).sort_index().to_numpy(dtype=float)


def _usable(dense: pd.DataFrame, sparse: pd.DataFrame, slack: float) -> tuple[list[int], list[Gate]]:
    """The replicates every claim reads (their dense toy learned addition, their sparse toy kept its held-out loss)
    and the two gates on them. A replicate that failed either is left out of each estimate and counted at its worst
    (`Claim.failed`, lmlab.claims): a gate blocks every decision only where fewer than two replicates are left, so
    one dense toy that did not learn among many no longer silences the rest."""
    learned = [int(r) for r in dense.index if dense.loc[r, "value"] >= TOY_LEARNED]
    over = sparse["ce"] - dense["ce"].reindex(sparse.index)
    kept_loss = [int(r) for r, d in over.items() if d <= slack]
    good = [r for r in learned if r in kept_loss]
    missed = [int(r) for r in dense.index if int(r) not in learned]
    gate = Gate("dense toys learned addition", len(learned) >= 2,
                why="exact match " + ", ".join(f"{100 * v:.1f}%" for v in dense["value"])
                    + f" (needs {100 * TOY_LEARNED:.0f}% each)"
                    + (f"; replicate(s) {', '.join(map(str, missed))} not learned: counted as failed in every claim"
                       if missed else ""),
                remedy="more toy_steps before the sparse toys can be judged")
    loss = held_out_loss_gate(over, slack, "more toy_sparse_steps before the sparsity can be judged")
    if len(kept_loss) >= 2 and not loss.passed:
        loss = Gate(loss.name, True, why=loss.why + ": counted as failed in every claim", remedy=loss.remedy)
    return good, [gate, loss]


def _count_failed(claims: list, failed: int, total_heads: int) -> None:
    """Each claim's failed replicates and the range its statistic lies in (its worst case)."""
    for c in claims:
        c.failed = failed
        c.bounds = ((-np.log2(max(total_heads, 1)), np.log2(max(total_heads, 1))) if "multiplier" in c.name
                    else (-1.0, 1.0) if "exact match" in c.name else (0.0, 1.0))


def toy_claims(result):
    """(claims, gates, numbers) of the toy's verdict."""
    toy = result.table("toy")
    reps = replicates_of(toy)
    sparse = toy[toy["variant"] == "sparse"].set_index("replicate").sort_index()
    dense = toy[toy["variant"] == "dense"].set_index("replicate").sort_index()
    slack = result.config.toy_slack
    good, gates = _usable(dense, sparse, slack)
    usable = good if len(good) >= 2 else reps
    seq = result.table("toy_seq")
    seq = seq[seq["replicate"].isin(usable)]
    seed = result.config.seed
    items = Resampler(seq["idx"].nunique(), len(usable), seed=seed)
    kept = declared(CLAIMS, "toy edges kept").measure(items.mean_claim, _matrix(seq, "kept"), unit="%", scale=100,
                                                      n_unit="test sequences", group="addition toy")
    match = declared(CLAIMS, "toy exact match, sparse - dense").measure(
        items.mean_claim, _matrix(seq, "sparse_em") - _matrix(seq, "dense_em"), unit=" pts", scale=100,
        n_unit="test sequences", group="addition toy")
    found = {key: c for key, c in curves(result).items() if key[1] in usable}
    several = len({t for t, _, _ in found}) > 1
    lacking = [f"replicate {r}, {v}{f', {t}' if several else ''}: {NO_EFFECT}" for (t, r, v), c in sorted(found.items())
               if not c.has_effect()]
    units = needed_per_unit(result.table("toy_rerank"), result.table("toy_rerank_draw"), found,
                            lambda t, v, r: (t, r, v), THRESHOLD)
    mult, ranked = _multiplier_claims(found, usable, seed, units) if not lacking else ([], None)
    claims = [kept, match] + mult
    if len(good) >= 2:
        _count_failed(claims, len(reps) - len(good), max((c.grid[-1] for c in found.values()), default=1))
    geco = result.table("toy_geco")  # the post-training's gates read the replicates the claims read
    gates += post_training_gates(sparse.loc[sparse.index.isin(usable)],
                                 geco[geco["replicate"].isin(usable)] if "replicate" in geco else geco, slack,
                                 "more toy_sparse_steps before the sparsity can be judged")
    gates += [ranked] if ranked is not None else []
    gates += [no_effect_gate(lacking), replicates_gate(len(usable))]
    numbers = {"replicates": len(reps), "kept_per_replicate": sparse["kept"].tolist(),
               "exact_match_dense": dense["value"].tolist(), "exact_match_sparse": sparse["value"].tolist(),
               "edges_per_query": sparse["edges_per_query"].tolist(), "floor": float(sparse["floor"].iloc[0])}
    return claims, gates, numbers


def toy_verdict(result, claim: str, seconds: float = 0.0, model_run: bool = False) -> Verdict:
    """The toy's claims judged; the model's half (multiplier on the four tasks) is priced, not run, unless
    `model_run` (then the model has its own verdict beside this one, and `seconds` is the toy's alone or 0)."""
    claims, gates, numbers = toy_claims(result)
    k = numbers["replicates"]
    judgement = judge(claims, gates, seconds=seconds, seconds_per_replicate=seconds / max(k, 1) if seconds else None)
    head = {"kind": "toy_head", "replicates": int(k), "model_run": bool(model_run),
            "kept": [float(v) for v in numbers["kept_per_replicate"]], "floor": float(numbers["floor"]),
            "sparse": [float(v) for v in numbers["exact_match_sparse"]],
            "dense": [float(v) for v in numbers["exact_match_dense"]]}
    priced = [] if model_run else [{"kind": "toy_priced", "steps": int(FULL_SPARSE_STEPS)}]
    scope = {"kind": "toy_scope"}
    return Verdict(status=judgement.status, claim="On the addition toy: " + claim,
                   parts=[head, judgement_part(judgement), *priced, scope],
                   evidence={"part": "toy", **numbers,
                             **evidence(claims, gates, scope=part_text(scope), judgement=judgement)})


def _effect_panel(left, task: str, found: dict, claims: list, n_tasks: int) -> None:
    """One toy task's panel: the dense and sparse curves over replicates and the task's multiplier."""
    for variant, color, label in (("dense", "tab:blue", "Dense toy"), ("sparse", "tab:orange", "Sparse toy")):
        lines = [found[key] for key in sorted(found) if key[0] == task and key[2] == variant]
        if not lines:
            continue
        grid = lines[0].grid
        ee = np.array([c.explained() for c in lines])
        for row in ee:
            left.plot(grid, row, color=color, lw=0.7, alpha=0.5)
        left.plot(grid, ee.mean(0), color=color, lw=2.2, label=f"{label} (mean of {len(lines)})")
        left.fill_between(grid, ee.min(0), ee.max(0), color=color, alpha=0.15, linewidth=0)
    left.axhline(THRESHOLD, color="grey", linestyle=":", linewidth=1)
    left.set(xlabel="Number of Heads Kept", ylabel="Explained Effect", ylim=(-0.1, 1.15),
             title=f"Addition toy: {task}\n" + textwrap.fill(f"({TOY_TASKS.get(task, '')})", 48 if n_tasks > 1 else 90))
    left.title.set_fontsize(9)
    left.legend(loc="lower right", fontsize=8)
    mult = next((c for c in claims if c.name.endswith("at 0.9)") and (n_tasks == 1 or c.group == f"toy: {task}")),
                None)
    if mult is not None:
        lo, hi = mult.interval()
        left.text(0.97, 0.45, f"multiplier {2 ** mult.estimate:.1f}x\n[{2 ** lo:.1f}, {2 ** hi:.1f}]",
                  transform=left.transAxes, ha="right", va="top", fontsize=11, fontweight="bold")


def toy_seed_figure(result, fig=None):
    """The paper's figure at toy scale: per toy task, explained effect vs heads kept, dense vs sparse (each replicate a
    thin line, their mean bold with the band over replicates) and the task's multiplier with its interval; and edges
    kept and exact match per replicate."""
    found = curves(result)
    toy = result.table("toy")
    tasks = sorted({t for t, _, _ in found}, key=list(TOY_TASKS).index) or ["ones"]
    fig, axes = canvas(fig, (4.2 * len(tasks) + 4.4, 4.0), 1, len(tasks) + 1,
                       gridspec_kw={"width_ratios": [1.5] * len(tasks) + [1]})
    claims, _, _ = toy_claims(result)
    for task, left in zip(tasks, axes[:-1]):
        _effect_panel(left, task, found, claims, len(tasks))
    right = axes[-1]
    sparse = toy[toy["variant"] == "sparse"].sort_values("replicate")
    dense = toy[toy["variant"] == "dense"].sort_values("replicate")
    x = np.arange(len(sparse))
    right.bar(x - 0.2, 100 * sparse["kept"], width=0.4, color="tab:orange", label="edges kept (%)")
    right.axhline(100 * EDGES_LIMIT, color="grey", linestyle=":", lw=1, label=f"{100 * EDGES_LIMIT:.0f}% limit")
    right.set(xticks=x, xticklabels=[f"rep {int(r)}" for r in sparse["replicate"]], ylabel="edges kept (%)",
              title="Sparse toys: edges kept;\nexact match (right axis)")
    right.title.set_fontsize(10)
    twin = right.twinx()
    twin.plot(x, 100 * dense["value"].to_numpy(), "s", color="tab:blue", label="exact match dense")
    twin.plot(x, 100 * sparse["value"].to_numpy(), "^", color="tab:orange", label="exact match sparse")
    twin.set(ylim=(0, 101), ylabel="exact match (%)")
    handles = right.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    right.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper center", ncol=2,
                 bbox_to_anchor=(0.5, -0.1))
    fig.suptitle("Sparse attention post-training on a 4-layer transformer trained in the run on 2-digit addition\n"
                 "(the paper's Figure 1 setting); multiplier = dense heads / sparse heads at 0.9", fontsize=10)
    return finish(fig)
