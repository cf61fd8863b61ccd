"""S3 · Meaningless tokens and the Activation Redistribution Module (Shi et al., arXiv 2510.01032).

Recipe:
 - prompt = instruction ("Please reason step by step, and put your final answer within \\boxed{}.")
   + inserted tokens + problem; Mless = 55 x " /", Mful = 55 x " he", between the instruction and the
   problem by default, inside the user turn for chat-template models. Prompts are assembled from token
   ids, so each inserted token lands exactly where asked (and is exactly one token);
 - decoding with a token budget: quick greedy with 256 new tokens (98% of the embedded model's answers end
   by themselves), full as the paper: 2048 new tokens, five temperature-sampled runs per problem; the table
   records how often an answer ran into the budget, because brevity is a confound;
 - scoring as the paper: the last \\boxed{} of the output (quick falls back to its last number, a DECISION
   in config.py), normalised, against the gold answer; each row says what scored it;
 - sweeps on a subset: insertion length (0 to 70) and position (before / between / after);
 - attention profiles of every layer-0 head, mean attention each key receives from later queries, sink excluded;
   inserted positions removed for the aligned None/Mless/Mful plot (recorded as read, and with each query's
   attention renormalised over the original keys, which the peak claims read), kept for the long Mless/Mful plot.
   The analysis chooses the head (`--head`, or the one whose profile changes most on half the profiled problems)
   and judges it on the other half;
 - mechanism check: share of near-zero layer-0 MLP activations (|a| < 0.01) on the original tokens;
 - ARM in layer 0, (c, p1) tuned on a disjoint dev split, reported on the test split; its statistics over
   the whole activation tensor of a call, as the authors' code does (`arm_scope`; see interventions/arm.py).
   Given a single (c, p1) pair (the demo's) there is nothing to tune, and the dev split is not generated.

Placebo (`--placebo`): the same run with the treatment replaced by one that cannot have the paper's effect. Every
inserted token stays in the prompt at its position but is masked from every query (measure.py says how), in the
answers, the sweeps, the profiles and the pace alike; the prompts, positions, problems and budget are unchanged. ARM's
arm redistributes nothing: it is the plain model, decoded as w/o is (no dev split, nothing to tune). A redistribution
of any size or kind (a random one, say) is an edit that may move answers by itself; an edit of nothing cannot have
ARM's effect, and under greedy decoding it gives w/o's answers, so its claim can only come out open or "no".
"""

from __future__ import annotations

import random

import pandas as pd

from lmlab import parallel
from lmlab.data.math import MathItem, read_math_file, split_arithmetic
from lmlab.errors import LmlabError
from lmlab.models import LoadedModel
from lmlab.runs import RunDir
from lmlab.studies.filler.config import Config, Treatment, unknown_benchmark
from lmlab.studies.filler.measure import FILLERS, Job, build_ids, evaluate, evaluate_many, profile_and_mechanism_rows


def spread(items: list[MathItem], n: int) -> list[MathItem]:
    """n items taken evenly through the list (the test split is ordered by level, so all levels appear)."""
    step = max(1, len(items) // max(n, 1))
    return items[::step][:n]


def load_problems(config: Config) -> tuple[list[MathItem], list[MathItem], int]:
    if config.benchmark == "arithmetic":
        dev, test = split_arithmetic(config.size("n_dev_per_level"), config.size("n_test_per_level"), config.seed)
        return dev, test
    kind, _, path = config.benchmark.partition(":")
    if kind not in ("gsm8k", "math500"):
        raise unknown_benchmark(config.benchmark)
    if path:
        items = read_math_file(kind, path)
    else:
        from lmlab.data.math import hub_math_items

        items = hub_math_items(kind)
    random.Random(config.seed).shuffle(items)
    n_dev = min(len(items) // 5, 5 * config.size("n_dev_per_level"))
    return items[:n_dev], items[n_dev:n_dev + 5 * config.size("n_test_per_level")]


def run(config: Config, run_dir: RunDir, lm: LoadedModel | None = None) -> pd.DataFrame:
    dev, test = load_problems(config)  # a bad file or an unreachable hub fails before the model loads
    lm = lm or config.load()
    _check_model(lm, config)
    treatment = Treatment.of(config)  # the paper's or the placebo's, chosen here once and handed on
    facts = dict(benchmark=config.benchmark.split(":")[0], samples=config.size("samples"),
                 scoring=config.size("scoring"), max_new_tokens=config.size("max_new_tokens"),
                 insert_count=config.insert_count)
    if not config.size("accuracy"):  # the demo: attention and mechanism only, the gains priced
        run_dir.describe(model=lm.name, dev=0, test=0, **facts, accuracy_run=False)
        return pd.DataFrame(_profiles(lm, config, test, treatment) + [_pace(lm, config, test, treatment)])
    pairs = [(c, p1) for c in config.size("arm_c") for p1 in config.size("arm_p1")]
    # one (c, p1) pair leaves nothing to choose, and the placebo's ARM redistributes nothing: no dev split for them
    tune = len(pairs) > 1 and treatment.redistributes
    run_dir.log(f"{len(dev)} dev and {len(test)} test problems" if tune else
                f"{len(test)} test problems (no ARM pair to tune, so no dev split)")
    main, sweeps = _jobs(config, dev, test, tune, treatment)
    answers = evaluate_many(lm, run_dir, main + sweeps, config, treatment)
    tuning, best = _tune_arm(lm, run_dir, dev, pairs if treatment.redistributes else [], tune, config, treatment)
    arm_test = evaluate(lm, run_dir, test, "ARM", config, treatment, arm=dict(c=best["c"], p1=best["p1"])) \
        if treatment.redistributes else []
    rows = tuning + [r for job in answers[:len(main)] for r in job] + arm_test
    rows += [r for job in answers[len(main):] for r in job]

    parallel.main_only()  # under a launch the generation was shared out; the rest is rank 0's
    rows += _profiles(lm, config, test, treatment)
    run_dir.describe(model=lm.name, dev=len(dev), test=len(test), **facts, arm_c=best["c"], arm_p1=best["p1"],
                     accuracy_run=True, arm=treatment.arm)
    return pd.DataFrame(rows)


def _check_model(lm, config: Config) -> None:
    if not lm.layout.causal:
        raise LmlabError(f"{lm.name} is not a causal language model; the filler study generates text")
    if config.head is not None and config.head >= lm.layout.n_heads:
        raise LmlabError(f"--head {config.head} does not exist; {lm.name} has heads 0..{lm.layout.n_heads - 1}")


def _jobs(config: Config, dev, test, tune: bool, treatment: Treatment) -> tuple[list[Job], list[Job]]:
    """The conditions generated without ARM, in shared calls: dev w/o (where ARM is tuned), the test conditions
    (and the placebo's ARM, the plain model), and the sweeps on a subset (length 0 and 55-between reuse the main
    conditions)."""
    n = config.insert_count
    subset = spread(test, config.size("sweep_problems"))
    main = ([Job(dev, "w/o", split="dev")] if tune else []) + [Job(test, "w/o")] + \
        [Job(test, name, f, n) for name, f in FILLERS.items()]
    if not treatment.redistributes:  # ARM that redistributes nothing: the plain model, in the shared calls
        main.append(Job(test, "ARM"))
    sweeps = [Job(subset, "Mless", FILLERS["Mless"], length, sweep=f"length={length}") for length in config.sweep_lengths]
    sweeps += [Job(subset, name, f, n, position, sweep=f"position={position}")
               for name, f in FILLERS.items() for position in ("before", "after")]
    return main, sweeps


def _tune_arm(lm, run_dir: RunDir, dev, pairs, tune: bool, config: Config,
              treatment: Treatment) -> tuple[list[dict], dict]:
    """ARM's (c, p1) tuned on dev: a tuning row per pair and the chosen one (the placebo's ARM has no (c, p1):
    nothing is tuned, and the counts row says what stood in for it)."""
    tuning = []
    for c, p1 in pairs:
        if tune:
            got = evaluate(lm, run_dir, dev, "ARM", config, treatment, arm=dict(c=c, p1=p1), split="dev",
                           sweep=f"c={c},p1={p1}")
            tuning.append(dict(kind="tuning", c=c, p1=p1, dev_accuracy=sum(r["correct"] for r in got) / len(got)))
        else:
            tuning.append(dict(kind="tuning", c=c, p1=p1, dev_accuracy=float("nan"), note="the only pair given"))
    best = max(tuning, key=lambda r: r["dev_accuracy"]) if tuning else dict(c=float("nan"), p1=float("nan"))
    for row in tuning:
        row["chosen"] = int(row is best)
    return tuning, best


def _profiles(lm, config: Config, test, treatment: Treatment) -> list[dict]:
    """The attention profiles (every head) and the mechanism check on `profile_problems` test problems (the
    placebo: the inserted tokens masked)."""
    parallel.main_only()
    probe = spread(test, config.profile_problems)
    n = config.insert_count
    prompts = {cond: [build_ids(lm, item.question, FILLERS.get(cond), n if cond in FILLERS else 0) for item in probe]
               for cond in ("None", "Mless", "Mful")}
    return profile_and_mechanism_rows(lm, prompts, config.profile_layer, hide=treatment.placebo)


def _pace(lm, config: Config, test, treatment: Treatment) -> dict:
    """What one answer costs here, at the pace the accuracy run would go: one batch of `batch_size` problems (the
    test problems in turn, w/o and Mless alternating) decoded greedily at the profile's budget, the time shared
    out over its answers, so the verdict can price the accuracy gains it does not run. (One answer at a time would
    price the run at many times its cost: a batch's step costs little more than one row's.)"""
    import time

    from lmlab.generation import greedy_answers

    built = [build_ids(lm, item.question) if n % 2 == 0 else
             build_ids(lm, item.question, FILLERS["Mless"], config.insert_count)
             for n, item in ((n, test[(n // 2) % len(test)]) for n in range(config.size("batch_size")))]
    prompts = [ids for ids, _ in built]
    budget = config.size("max_new_tokens")
    t0 = time.perf_counter()
    outs = greedy_answers(lm, prompts, budget, len(prompts), stop_at_newline=False, description="pace",
                          masked=treatment.hidden(built))
    seconds = time.perf_counter() - t0
    return dict(kind="pace", seconds_per_answer=seconds / len(prompts), max_new_tokens=budget,
                tokens=float(sum(len(o) for o in outs) / len(outs)), batch=len(prompts))
