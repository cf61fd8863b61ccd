"""Claims, gates and the two-level interval (lmlab.claims)."""

import copy

import numpy as np
import pytest

from lmlab.claims import declared, deciding, Bar, Gate, replicates_gate
from lmlab.render import claim_line, decided_text, judged
from lmlab.resampling import Resampler, replicate_seed


def _items(means, n=200, seed=0):
    """(replicates, items) of 0/1 outcomes with the given per-replicate rates."""
    rng = np.random.default_rng(seed)
    return np.stack([(rng.random(n) < m).astype(float) for m in means])


def test_replicate_seeds_differ_between_runs_and_replicates():
    seeds = {replicate_seed(s, r) for s in range(3) for r in range(5)}
    assert len(seeds) == 15
    assert replicate_seed(0, 1) == replicate_seed(0, 1)


def test_replicates_that_agree_decide_and_replicates_that_disagree_stay_open():
    agree = Resampler(200, 3).mean_claim("accuracy", _items([0.9, 0.91, 0.89]), Bar(">=", 0.6), source="paper")
    status, text = judged([agree])
    assert agree.decision == "yes" and status == "reproduced"
    # two replicates far above the bar, one far below: every item interval alone would look decided
    split = Resampler(2000, 3).mean_claim("accuracy", _items([0.9, 0.92, 0.2], n=2000), Bar(">=", 0.6), source="paper")
    status, text = judged([split])
    assert split.decision == "open" and status == "inconclusive"
    assert "disagree" in split.reason
    assert "seeds" in text  # what would decide it: more seeds
    assert split.decides_at["seeds"] > 3


def test_one_stray_replicate_of_many_leaves_the_interval_to_decide():
    """At 10 replicates one landing across the bar is the spread the interval carries: the interval decides (the
    rule that any one replicate across keeps a claim open made more seeds decide less). Three of ten across, or
    one of four, still keep it open."""
    rates = [0.80, 0.82, 0.78, 0.81, 0.79, 0.83, 0.80, 0.77, 0.82, 0.58]  # the last one below the 0.6 bar
    stray = Resampler(2000, 10).mean_claim("accuracy", _items(rates, n=2000), Bar(">=", 0.6), source="paper")
    assert stray.low > 0.6 and stray.across() == 0 and stray.decide() == "yes"
    three = Resampler(2000, 10).mean_claim("accuracy", _items(rates[:7] + [0.58, 0.57, 0.59], n=2000), Bar(">=", 0.6), source="paper")
    assert three.across() == 3 and three.decide() == "open" and "3 of 10 across" in three.reason
    four = Resampler(2000, 4).mean_claim("accuracy", _items([0.8, 0.82, 0.81, 0.58], n=2000), Bar(">=", 0.6), source="paper")
    assert four.across() == 1 and four.decide() == "open"


def test_a_claim_short_of_its_bar_at_95_but_not_at_the_level_of_no_says_so():
    claim = Resampler(2000, 3).mean_claim("accuracy", _items([0.55, 0.56, 0.57], n=2000), Bar(">=", 0.6), source="paper")
    assert claim.high < 0.6 and claim.interval(0.9999)[1] > 0.6
    assert claim.decide(no_confidence=0.9999) == "open" and "not at the 99.99% that 'no' is read at" in claim.reason
    assert claim.decide(no_confidence=0.95) == "no"


def test_a_yes_guarded_as_a_no_is_read_at_its_level():
    """compare reads "keeps" at the family-wise level as "does not keep": past the bar at 95% but not at 99.99% is
    open, with the reason; at 95% the same claim says yes."""
    claim = Resampler(2000, 3).mean_claim("accuracy", _items([0.62, 0.63, 0.64], n=2000), Bar(">=", 0.6), source="paper")
    assert claim.low > 0.6 and claim.interval(0.9999)[0] < 0.6
    assert claim.decide(no_confidence=0.9999) == "yes"
    claim.guard_yes = True
    assert claim.decide(no_confidence=0.9999) == "open"
    assert "past the bar at 95% but not at the 99.99% that 'yes' is read at" in claim.reason
    many = [copy.deepcopy(claim) for _ in range(500)]  # 500 answers: each read at 1 - 0.05/500 = 99.99%
    assert judged(many)[0] == "inconclusive" and many[0].decision == "open"  # judge keeps the claim's guard


def test_an_inconclusive_verdict_names_an_open_claim_more_data_could_decide_before_one_at_a_ceiling():
    """Of two open paper claims, the one held open at a ceiling is not what the verdict names: the other, which more
    data could decide, is."""
    items = _items([0.55, 0.6, 0.65], n=200)
    first = Resampler(200, 3).mean_claim("gain", items, Bar(">=", 0.9), source="paper")
    first.ceiling = "the arm it must beat sits at the ceiling"
    second = Resampler(200, 3).mean_claim("level", items, Bar(">=", 0.6), source="paper")
    status, _ = judged([first, second])
    assert status == "inconclusive" and first.decision == second.decision == "open"
    assert deciding([first, second])["name"] == "level"


def test_a_claim_on_its_bar_is_not_priced_in_astronomical_seeds():
    rng = np.random.default_rng(0)
    items = np.stack([rng.permutation(np.r_[np.ones(ones), np.zeros(2000 - ones)]) for ones in (1180, 1220, 1200)])
    claim = Resampler(2000, 3).mean_claim("accuracy", items, Bar(">=", 0.6), source="paper")  # 0.59, 0.61, 0.60: exactly on the bar
    assert abs(claim.estimate - 0.6) < 0.25 * claim.se and claim.decide() == "open"
    assert "sits on the bar" in claim.sizing()["text"] and claim.decides_at["seeds"] == 3


def test_the_interval_widens_with_the_spread_between_replicates():
    same = Resampler(300, 3).mean_claim("x", _items([0.7, 0.7, 0.7], n=300), Bar(">=", 0.5), source="paper")
    spread = Resampler(300, 3).mean_claim("x", _items([0.6, 0.7, 0.8], n=300), Bar(">=", 0.5), source="paper")
    assert (spread.high - spread.low) > 2 * (same.high - same.low) - 0.05
    assert spread.se_seed > same.se_seed
    assert spread.df < 20  # few replicates: a t quantile well above 1.96


def test_three_replicates_cover_the_method_mean_at_about_95_percent():
    """Simulated training runs: each replicate's true rate is the method's rate plus seed noise (sd 0.05), items are
    0/1 draws. The claim's 95% interval must cover the method's rate in roughly 95% of simulated studies (an
    item-only interval would cover far less)."""
    rng = np.random.default_rng(1)
    truth, covered, item_only = 0.7, 0, 0
    runs = 300
    for i in range(runs):
        rates = np.clip(truth + rng.normal(0, 0.05, 3), 0, 1)
        x = np.stack([(rng.random(150) < r).astype(float) for r in rates])
        c = Resampler(150, 3, n_boot=200, seed=i).mean_claim("x", x, Bar(">=", 0.5), source="paper")
        covered += c.low <= truth <= c.high
        half = 1.96 * c.se_item
        item_only += c.estimate - half <= truth <= c.estimate + half
    assert covered / runs >= 0.90
    assert item_only / runs < covered / runs - 0.1


def test_a_null_bar_decides_on_the_estimate_past_the_bar_and_the_interval_clear_of_zero():
    x = -np.stack([np.full(100, 30.0) + np.random.default_rng(r).normal(0, 20, 100) for r in range(3)])
    c = Resampler(100, 3).mean_claim("gap", x, Bar("<=", -10, null=0.0), unit=" pp", source="paper")
    assert judged([c])[0] == "reproduced"
    near = Resampler(100, 3).mean_claim("gap", x / 6, Bar("<=", -10, null=0.0), source="paper")  # about -5: clearly not far
    assert near.decide() == "no"


def test_gates_block_decisions_and_one_replicate_cannot_decide_a_training_method():
    x = _items([0.3, 0.31, 0.29], n=400)
    fails = Resampler(400, 3).mean_claim("acc", x, Bar(">=", 0.6), source="paper")
    status, _ = judged([fails], [Gate("converged", False, "loss still falling", "more steps", blocks="no")])
    assert fails.decision == "no" and status == "inconclusive"
    assert judged([fails])[0] == "not reproduced"
    one = Resampler(400, 1).mean_claim("acc", x[:1], Bar(">=", 0.6), source="paper")
    status, text = judged([one], [replicates_gate(1)])
    assert status == "inconclusive" and "--seeds" in text


def test_many_claims_read_no_at_the_family_wise_level():
    """A claim that would fail at 95% but not at 1 - 0.05/m, with m claims, does not make 'not reproduced'."""
    x = np.random.default_rng(0).normal(0.0, 1.0, (1, 400)) - 0.11  # mean about -0.11, se about 0.05
    c = Resampler(400, 1).mean_claim("d", x, Bar(">=", 0.0), source="paper")
    lo95, hi95 = c.interval(0.95)
    assert hi95 < 0 < c.interval(1 - 0.05 / 20)[1]
    others = [Resampler(400, 1).mean_claim(f"o{i}", x + 5, Bar(">=", 0.0), source="paper") for i in range(19)]
    status, text = judged([c, *others])
    assert c.decision == "open" and status == "inconclusive" and "Bonferroni over 20" in text
    assert judged([Resampler(400, 1).mean_claim("d", x, Bar(">=", 0.0), source="paper")])[0] == "not reproduced"


def test_paired_statistics_see_the_same_item_draws():
    r = Resampler(50, 2, n_boot=100, seed=3)
    seen = []
    r.claim("a", lambda k, idx: seen.append(idx.copy()) or 0.0, Bar(">=", 0))
    first = seen[2:]
    seen.clear()
    r.claim("b", lambda k, idx: seen.append(idx.copy()) or 0.0, Bar(">=", 0))
    assert all(np.array_equal(a, b) for a, b in zip(first, seen[2:]))


def test_reported_claims_never_decide():
    x = _items([0.2, 0.21, 0.2], n=400)
    main = Resampler(400, 3).mean_claim("main", _items([0.9, 0.9, 0.9], n=400), Bar(">=", 0.6), source="paper")
    side = Resampler(400, 3).mean_claim("side", x, Bar(">=", 0.6), reported=True)
    assert judged([main, side])[0] == "reproduced"
    assert side.decision == "no"


@pytest.mark.parametrize("k", [1, 3])
def test_claims_serialise_with_their_interval_and_decision(k):
    from lmlab.claims import evidence

    c = Resampler(100, k).mean_claim("acc", _items([0.8] * k, n=100), Bar(">=", 0.5), unit="%", scale=100)
    judged([c])
    d = evidence([c], [Gate("g", True)])
    assert d["schema"] == 4 and d["claims"][0]["source"] == "lmlab" and d["claims"][0]["decision"] == "yes" and d["claims"][0]["low"] < d["claims"][0]["high"]
    assert d["claims"][0]["replicates"] == k and d["gates"][0]["passed"]


def test_a_claim_computed_for_all_resamples_at_once_equals_the_loop_over_them():
    """S1's Q-A gap as weights x matrices (Resampler.weighted_claim, knockout.analysis._gap) against the same
    resamples one at a time, the gap computed layer by layer from the resampled rows."""
    from lmlab.studies.knockout.analysis import _gap

    rng = np.random.default_rng(3)
    n, layers, k = 40, 4, 3
    data = []
    for _ in range(k):
        dp = rng.normal(-0.3, 0.2, (n, layers))
        dp[rng.random((n, layers)) < 0.1] = np.nan  # layers a question lacks
        data.append((dp, (rng.random((n, layers)) < 0.4).astype(float)))

    def by_hand(dp, flip, idx):
        per_layer = []
        for l in range(layers):
            x, f = dp[idx, l], flip[idx, l]
            q, a = x[(f == 1) & ~np.isnan(x)], x[(f == 0) & ~np.isnan(x)]
            if len(q) and len(a):
                per_layer.append(q.mean() - a.mean())
        return float(np.mean(per_layer)) if per_layer else float("nan")

    sampler = Resampler(n, k, n_boot=200, seed=5)
    fast = sampler.weighted_claim("gap", lambda r, w: _gap(*data[r], w), Bar("<=", -0.1))
    slow = sampler.claim("gap", lambda r, idx: by_hand(*data[r], idx), Bar("<=", -0.1))
    assert fast.estimate == pytest.approx(slow.estimate, abs=1e-12)
    assert fast.replicate_estimates == pytest.approx(slow.replicate_estimates, abs=1e-12)
    assert (fast.se, fast.se_item, fast.df) == pytest.approx((slow.se, slow.se_item, slow.df), rel=1e-9)


def _claim(level: float, source: str, bar=0.6, n=2000) -> "Claim":
    return Resampler(n, 3).mean_claim("accuracy", _items([level] * 3, n=n), Bar(">=", bar), source=source)


def test_only_a_paper_claim_that_fails_makes_not_reproduced():
    """The rule of whose claim decides what: a decisive claim of ours at "no" holds the verdict at inconclusive and
    says so; the paper's at "no" makes it "not reproduced"; a verdict of our claims alone is never "reproduced"."""
    from lmlab.claims import deciding

    ours_no = _claim(0.3, "lmlab")
    status, text = judged([_claim(0.9, "paper"), ours_no])
    assert ours_no.decision == "no" and status == "inconclusive" and "a claim of ours fails (accuracy)" in text
    assert deciding([_claim(0.9, "paper"), ours_no])["source"] == "lmlab"
    paper_no = _claim(0.3, "paper")
    status, _ = judged([paper_no, _claim(0.9, "lmlab")])
    assert status == "not reproduced"
    decided = deciding([paper_no])
    assert decided["kind"] == "claim" and decided["source"] == "paper" and decided["decision"] == "no"
    ours_yes = _claim(0.9, "lmlab")
    status, text = judged([ours_yes])
    assert ours_yes.decision == "yes" and status == "inconclusive" and "no claim of the paper's decides" in text
    assert judged([_claim(0.9, "paper"), _claim(0.9, "lmlab")])[0] == "reproduced"


def test_declared_claims_carry_their_source_and_a_verdict_names_what_decided_it():
    from lmlab.claims import Declared, declared, evidence

    specs = [Declared("accuracy", "share right", ">=", 0.6, "paper", "its Table 1: 0.8", bar_note="ours: 0.6"),
             Declared("side", "a side number", ">=", 0.6, "lmlab", "a check of ours", decisive=False)]
    c = declared(specs, "accuracy").attach(_claim(0.3, "lmlab"))
    side = declared(specs, "side").attach(_claim(0.3, "lmlab"))
    assert c.source == "paper" and c.where == "its Table 1: 0.8" and side.reported
    status, _ = judged([c, side])
    d = evidence([c, side])
    assert status == "not reproduced" and d["deciding"]["name"] == "accuracy"
    assert d["deciding"]["bar"] == {"direction": ">=", "value": 0.6, "null": None, "margin": None}
    assert d["deciding"]["decision"] == "no" and d["deciding"]["where"] == "its Table 1: 0.8"
    assert decided_text(d["deciding"]).startswith("accuracy: +0.30 [") and "(bar >= +0.6; no); paper: its Table 1" \
        in decided_text(d["deciding"])
    assert [x["source"] for x in d["claims"]] == ["paper", "lmlab"]
    with pytest.raises(KeyError):
        declared(specs, "missing")


def test_a_claim_whose_arms_sit_at_a_ceiling_decides_nothing():
    """Both arms at 100% in every replicate: a difference of exactly 0 with no spread, which a non-inferiority bar
    would call "yes" whatever the method did; it is open, and says why."""
    from lmlab.claims import at_bound

    cot = np.ones((3, 60))
    latent = np.ones((3, 60))
    c = Resampler(60, 3).mean_claim("accuracy r - CoT", latent - cot, Bar(">=", -0.01), source="paper")
    c.ceiling = at_bound(latent, cot)
    status, _ = judged([c])
    assert c.decision == "open" and "ceiling" in c.reason and status == "inconclusive"
    assert at_bound(np.zeros((3, 5)), np.zeros((3, 5))).startswith("every arm at the floor")
    assert at_bound(np.ones((3, 5)), np.r_[np.ones(14), 0.0].reshape(3, 5)) == ""


# --- one declaration decides; a margin of ours widens "no", never "yes" -------------------------------------------

def _paired(mean_diff: float, n: int = 400, k: int = 3, sd: float = 4.0, seed: int = 0) -> np.ndarray:
    """Per-item differences of two arms (replicates x items), centred on `mean_diff`."""
    rng = np.random.default_rng(seed)
    return mean_diff + sd * rng.standard_normal((k, n))


@pytest.mark.parametrize("seed", range(5))
def test_budget_c_trained_as_budget_a_never_says_yes(seed):
    """S2's Budget-C >= Budget-A with C = A (the same arm twice, differences centred on 0): the old bar (>= -1 point)
    said yes; the declared claim needs the paper's direction for yes and our margin for no, so it stays open."""
    from lmlab.studies.quantize.analysis import CLAIMS

    spec = declared(CLAIMS, "Budget-C - Budget-A")
    c = spec.attach(Resampler(400, 3, seed=seed).mean_claim("Budget-C - Budget-A", _paired(0.0, seed=seed),
                                                            spec.make_bar(), source="paper"))
    judged([c])
    assert c.decision == "open"
    assert c.bar.margin == -1.0 and "'no' only below -1" in spec.bar
    far_below = spec.attach(Resampler(400, 3).mean_claim("x", _paired(-3.0), spec.make_bar()))
    slightly_below = spec.attach(Resampler(4000, 3).mean_claim("x", _paired(-0.5, n=4000), spec.make_bar()))
    above = spec.attach(Resampler(400, 3).mean_claim("x", _paired(+2.0), spec.make_bar()))
    judged([far_below]), judged([slightly_below]), judged([above])
    assert (far_below.decision, slightly_below.decision, above.decision) == ("no", "open", "yes")


def test_a_level_token_count_is_not_a_steady_fall():
    """S0's 'tokens, next rate - rate' with equal counts at both rates: open (the old bar, <= +0.5, said yes)."""
    from lmlab.studies.latent.analysis import CLAIMS

    spec = declared(CLAIMS, "tokens, next rate - rate")
    level = spec.attach(Resampler(200, 3).mean_claim("tokens", np.zeros((3, 200)), spec.make_bar()))
    noisy = spec.attach(Resampler(200, 3).mean_claim("tokens", _paired(0.0, n=200, sd=2.0), spec.make_bar()))
    rises = spec.attach(Resampler(200, 3).mean_claim("tokens", _paired(3.0, n=200, sd=2.0), spec.make_bar()))
    falls = spec.attach(Resampler(200, 3).mean_claim("tokens", _paired(-3.0, n=200, sd=2.0), spec.make_bar()))
    for c in (level, noisy, rises, falls):
        judged([c])
    assert (level.decision, noisy.decision, rises.decision, falls.decision) == ("open", "open", "no", "yes")


def test_a_claim_is_judged_only_against_its_declared_bar():
    from lmlab.claims import Declared

    spec = Declared("gain", "a gain", ">=", 0.0, "paper", "its Table 2", null=0.0, margin=-1.0, unit=" pts")
    assert spec.bar == ">= 0 pts, interval above 0; 'no' only below -1 pts"
    with pytest.raises(ValueError, match="declared"):
        spec.attach(Resampler(50, 1).mean_claim("gain", np.zeros((1, 50)), Bar(">=", -1.0)))
    with pytest.raises(ValueError, match="lenient side"):
        Declared("gain", "a gain", ">=", 0.0, "paper", "its Table 2", margin=+1.0)
    with pytest.raises(ValueError, match="computed per run"):
        Declared("overlap", "an overlap", ">=", None, "lmlab", "ours").make_bar()
    per_run = Declared("overlap", "an overlap", ">=", None, "lmlab", "ours", rule="midway between R and C")
    assert per_run.make_bar(0.4).value == 0.4 and per_run.bar.startswith(">= midway")
    with pytest.raises(ValueError, match="declared"):
        spec.make_bar(0.5)


def test_no_bar_is_built_apart_from_its_declaration():
    """Every Bar in the package comes from a Declared (lmlab.claims builds them); a study that builds one by hand
    would decide other than what `lmlab claims` shows."""
    import re
    from pathlib import Path

    import lmlab

    root = Path(lmlab.__file__).parent
    hits = [f"{p.relative_to(root)}:{i + 1}" for p in root.rglob("*.py") if p.name != "claims.py"
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()) if re.search(r"\bBar\(", line)]
    assert not hits, hits


def test_one_arm_at_the_ceiling_blocks_a_gain():
    """CoT at 100% in every replicate, latent at 99.x%: the gain claim could only say "no"; it decides nothing."""
    from lmlab.claims import at_bound, blocks_gain
    from lmlab.studies.latent.analysis import CLAIMS

    cot = np.ones((3, 100))
    latent = np.ones((3, 100))
    latent[:, :1] = 0.0
    spec = declared(CLAIMS, "accuracy, latent - CoT")
    c = spec.attach(Resampler(100, 3).mean_claim("gain", latent - cot, spec.make_bar()))
    assert at_bound(latent, cot) == ""
    c.ceiling = at_bound(latent, cot) or blocks_gain(latent, cot)
    judged([c])
    assert c.decision == "open" and "ceiling" in c.reason
    assert blocks_gain(np.ones((3, 5)), np.full((3, 5), 0.5)) == ""  # the rising arm at the ceiling: a gain shows
    assert "floor" in blocks_gain(np.zeros((3, 5)), np.full((3, 5), 0.5))


def _with_failed(rates, failed, n=400, seed=3):
    """A paper claim over the replicates of `rates` (0/1 outcomes, bar >= 0.6) with `failed` more replicates that
    failed their recipe (no statistic: NaN), the statistic a share in [0, 1]."""
    per = np.vstack([_items(rates, n=n, seed=seed), np.full((failed, n), np.nan)])
    sampler = Resampler(n, len(rates) + failed, seed=seed)
    claim = sampler.weighted_claim("share", lambda r, w: (w @ np.nan_to_num(per[r])) / w.sum(1)
                                   if np.isfinite(per[r]).all() else np.full(len(w), np.nan),
                                   Bar(">=", 0.6), source="paper", failed=failed, bounds=(0.0, 1.0))
    return claim


def test_one_failed_replicate_of_twenty_is_counted_at_its_worst_and_the_answer_stands():
    """The rule of docs/claims.md: an answer stands if it stands without the failed replicates and with each of them
    counted at the worst case for it (the statistic's bound on the bar's other side). One failure among 20
    replicates moves the mean by a twentieth of the range, so the answer stands; the same failure among 4 does not
    let it stand, and more replicates never decide less."""
    rates = [0.80, 0.82, 0.78, 0.81, 0.79, 0.83, 0.80, 0.77, 0.82, 0.80,
             0.81, 0.79, 0.80, 0.82, 0.78, 0.81, 0.80, 0.79, 0.83]
    many = _with_failed(rates, failed=1)
    status, text = judged([many])
    assert many.replicates == 19 and many.failed == 1 and many.decision == "yes" and status == "reproduced"
    assert "1 more failed" in claim_line(many.as_dict())
    few = _with_failed(rates[:3], failed=1)
    judged([few])
    assert few.decision == "open" and "worst" in few.reason  # 3 good, 1 at 0: the mean falls to about 0.6
    # without the failed replicate the three would decide: the failure is what holds it open
    assert _with_failed(rates[:3], failed=0).decide() == "yes"
    # a "no" stands or falls the same way: at its worst a failed replicate is at the top of the range
    low = [0.30, 0.28, 0.32, 0.31, 0.29, 0.30, 0.27, 0.33, 0.30, 0.31, 0.29, 0.30, 0.28, 0.32, 0.31, 0.30, 0.29,
           0.31, 0.30]
    no = _with_failed(low, failed=1)
    assert judged([no])[0] == "not reproduced" and no.decision == "no"
    shaky = _with_failed(low[:2], failed=2)
    judged([shaky])
    assert shaky.decision == "open"


def test_a_scoped_gate_blocks_only_the_claims_it_is_about():
    """A gate about one dataset's claims sets them aside (not read) and leaves the others to decide; a gate about
    the whole run still blocks everything; a scoped gate that blocks 'yes' turns only its claims' 'yes' open."""
    sampler = Resampler(400, 3)
    good = lambda group: sampler.mean_claim("share", _items([0.9, 0.91, 0.89], n=400), Bar(">=", 0.6),  # noqa: E731
                                            source="paper", group=group)
    a, b = good("set-a"), good("set-b")
    gate = Gate("set-b: probes", False, why="too few answers", group="set-b")
    status, text = judged([a, b], [gate])
    assert status == "reproduced" and a.decision == "yes" and b.decision == "open" and b.set_aside
    assert "not read: set-b: probes" in claim_line(b.as_dict()) and "set-b: probes: FAILED" in text
    assert judged([a, b], [Gate("replicates", False)])[0] == "inconclusive"
    only_b = Gate("set-b: a weak test", False, blocks="yes", group="set-b", claims=("share",))
    assert judged([a, b], [only_b])[0] == "inconclusive" and a.decision == "yes" and b.decision == "open"
    assert judged([a, b], [Gate("set-c: probes", False, group="set-c")])[0] == "reproduced"
    other = Resampler(400, 3).mean_claim("other", _items([0.9, 0.91, 0.89], n=400), Bar(">=", 0.6), source="paper",
                                         group="set-a")
    status, text = judged([a, b, other], [Gate("no other", False, group="set-a", claims=("other",))])
    assert status == "inconclusive" and "not read in any group" in text  # a paper claim read nowhere: not reproduced
    every = Gate("all sets", False, group="set-a"), Gate("x", False, group="set-b")
    status, _ = judged([a, b], list(every))
    assert status == "inconclusive" and all(c.set_aside for c in (a, b))


def test_what_would_decide_stays_within_the_items_the_data_hold():
    """A claim whose items are the noise asks for more items; where the data hold fewer, it asks for more seeds at
    the most items there are, or says that nothing within the data decides it."""
    rates = [0.63, 0.64, 0.62]
    free = Resampler(100, 3, seed=1).mean_claim("share", _items(rates, n=100, seed=1), Bar(">=", 0.6), source="paper")
    judged([free])
    assert free.decision == "open" and free.decides_at["items"] > 150
    held = Resampler(100, 3, seed=1).mean_claim("share", _items(rates, n=100, seed=1), Bar(">=", 0.6), source="paper",
                                               pool=150)
    judged([held])
    assert held.decides_at["items"] <= 150
    assert "the data hold at most 150" in held.decides_at["text"] or "than the data hold" in held.decides_at["text"]


def test_a_study_measures_each_claim_in_one_call_from_its_declaration():
    """`Declared.measure` names the claim, builds its bar and attaches its source in one call: no study builds a
    declared bar by hand (`make_bar(`) or attaches a measured claim (`.attach(`), save a claim built whole from
    another study's intervals (compare's pathways, whose bar is the original's half effect)."""
    from pathlib import Path

    import lmlab

    root = Path(lmlab.__file__).parent / "studies"
    found = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.py")}
    assert not [name for name, text in found.items() if "make_bar(" in text and name != "compare/pathways.py"]
    assert [name for name, text in found.items() if ".attach(" in text] == ["compare/pathways.py"]


def test_measure_is_attach_of_the_resamplers_claim_at_the_declared_bar():
    from lmlab.claims import Declared
    from lmlab.resampling import Resampler

    spec = Declared("gain", "a mean", ">=", 0.0, "paper", "Table 1", null=0.0, unit=" pp")
    values = np.array([[0.1, 0.3, 0.2, 0.4, 0.0, 0.2]])
    one = spec.measure(Resampler(6, 1, seed=0).mean_claim, values, label="gain, task x", unit=" pp")
    two = spec.attach(Resampler(6, 1, seed=0).mean_claim("gain, task x", values, spec.make_bar(), unit=" pp"))
    assert one.name == "gain, task x" and one.source == "paper" and one.where == "Table 1"
    assert (one.estimate, one.interval(), one.bar) == (two.estimate, two.interval(), two.bar)
    ruled = Declared("close", "a gap", "<=", None, "lmlab", "ours", rule="the run's own")
    assert ruled.measure(Resampler(6, 1, seed=0).mean_claim, values, bar_value=0.5).bar.value == 0.5


def test_replicates_that_draw_their_own_items_are_read_conservatively():
    """Where each replicate draws its own items (compare's prompt draws), the spread between replicates already holds
    the items' noise; the two parts still add (the items' part counted twice, never narrower than either alone), and a
    replicate that disagrees beyond its items' noise widens the interval toward k - 1 degrees of freedom."""
    from lmlab.claims import interval_parts

    agree = interval_parts([0.10, 0.12, 0.11], 0.05, 40, shared=False)
    s = np.std([0.10, 0.12, 0.11], ddof=1) / np.sqrt(3)
    assert agree["se"] == pytest.approx(np.hypot(s, 0.05)) and agree["se"] >= 0.05
    assert "drawn per replicate" in agree["method"] and agree["df"] > 30
    apart = interval_parts([0.5, -0.2, -0.2], 0.01, 40, shared=False)
    s = np.std([0.5, -0.2, -0.2], ddof=1) / np.sqrt(3)
    assert apart["se"] >= s and apart["df"] < 2.5
