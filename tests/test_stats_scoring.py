import numpy as np
import pytest

from lmlab.data.scoring import alias_match, last_boxed, last_number, math_equal, normalize_answer, normalize_number
from lmlab.stats import bootstrap, bootstrap_diff, wilson


def test_wilson_matches_the_textbook_values():
    iv = wilson(8, 10)  # Wilson 95% for 8/10: 0.490 to 0.943
    assert iv.estimate == 0.8 and iv.low == pytest.approx(0.4902, abs=1e-3) and iv.high == pytest.approx(0.9433, abs=1e-3)
    zero = wilson(0, 20)
    assert zero.low == 0.0 and 0.1 < zero.high < 0.2
    assert wilson(0, 0).n == 0


def test_bootstrap_is_seeded_and_covers_the_mean():
    x = np.random.default_rng(3).normal(1.0, 1.0, 400)
    a, b = bootstrap(x, seed=7), bootstrap(x, seed=7)
    assert a == b and a.low < 1.0 < a.high and a.high - a.low < 0.3
    d = bootstrap_diff(x + 2, x)
    assert d.low > 1.5


def test_squad_normalisation_and_alias_match():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert alias_match("It is Paris, France.", ["paris"])
    assert not alias_match("Parisian food", ["Paris"])
    assert alias_match("the United Kingdom", ["UK", "United Kingdom"])


@pytest.mark.parametrize("text,expected", [
    (r"so \boxed{42}", "42"),
    (r"\boxed{1} then \boxed{\frac{3}{4}}", r"\frac{3}{4}"),
    (r"\boxed{x^{2}+{1}}", "x^{2}+{1}"),
    (r"\boxed{unclosed", None),
    ("no box", None),
])
def test_last_boxed_handles_nesting(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("a,b", [("1,234", "1234"), ("-3", "-3.0"), ("3/4", r"\frac{3}{4}"), ("0.750", "3/4"),
                                 (r"\dfrac{6}{8}", "0.75"), ("$12", "12"), ("50\\%", "50")])
def test_numbers_compare_after_normalisation(a, b):
    assert normalize_number(a) == normalize_number(b)
    assert math_equal(a, b)


def test_last_number_in_free_text():
    assert last_number("She has 1,250 apples and gives -3.5 away") == "-3.5"
    assert last_number("answer: 7/8.") == "7/8"
    assert last_number("none") is None
    assert not math_equal(None, "1")


def test_the_size_that_decides_a_known_effect_detects_it_at_80_percent_power():
    """A synthetic paired effect of +2 points, spread sd 0.3: the size n_to_decide gives from a small run must
    detect +2 points in about 80% of simulated runs of that size (and a run of the small size far less often)."""
    import numpy as np

    from lmlab.stats import decide_sentence, n_to_decide

    rng = np.random.default_rng(0)
    effect, sd, small = 0.02, 0.3, 200
    pilot = rng.normal(effect, sd, small)
    half = 1.96 * pilot.std(ddof=1) / np.sqrt(small)
    needed = n_to_decide(small, half, effect)
    assert needed == pytest.approx((2.8 * sd / effect) ** 2, rel=0.15)  # (z_a + z_b)^2 sd^2 / effect^2

    def power(n, runs=400):
        x = rng.normal(effect, sd, (runs, n))
        low = x.mean(1) - 1.96 * x.std(1, ddof=1) / np.sqrt(n)
        return float((low > 0).mean())
    assert 0.70 <= power(needed) <= 0.90
    assert power(small) < 0.2
    text = decide_sentence("problems", small, needed, 60.0, "+2 points")
    assert f"about {needed:,} problems (this run: 200)" in text and "min" in text or " h " in text
    assert n_to_decide(small, float("nan"), effect) is None and n_to_decide(0, half, effect) is None


def test_s3_verdict_prints_the_problems_and_time_that_would_decide_the_papers_gain():
    """A synthetic S3 result with a small true gain: inconclusive, and the size it prints matches the paired formula."""
    import numpy as np
    import pandas as pd

    from lmlab.studies import filler
    from lmlab.studies.filler.analysis import PAPER_GAIN
    from lmlab.studies.result import from_rows

    rng = np.random.default_rng(1)
    n = 60
    base = rng.random(n) < 0.3
    rows = []
    for cond, flip in (("w/o", 0.0), ("Mless", 0.05), ("Mful", 0.05), ("ARM", 0.0)):
        correct = base | (rng.random(n) < flip)
        rows += [dict(kind="answer", split="test", sweep="", condition=cond, id=f"p{i}", level=1, sample=0,
                      correct=int(c), hit_budget=0) for i, c in enumerate(correct)]
    for cond in ("None", "Mless", "Mful"):
        rows += [dict(kind="profile", view="aligned", condition=cond, problem=p, position=j, head=0, layer=0,
                      attention=(0.5 if cond == "None" else 0.3) * (j == 0) + 0.01) for p in range(6) for j in range(3)]
    rows += [dict(kind="mlp", condition=c, near_zero_share=0.1) for c in ("None", "Mless", "Mful")]
    result = from_rows("filler", pd.DataFrame(rows), "m", meta=dict(max_new_tokens=64, benchmark="arithmetic"))
    result.seconds = 120.0
    v = filler.SPEC.verdict(result)
    assert v.status == "inconclusive"
    opened = [c for c in v.evidence["claims"] if c["name"].endswith("accuracy") and c["decision"] == "open"]
    assert opened
    for c in opened:  # the size at which the paper's gain clears the bar at 80% power, from this run's spread
        se = c["se"]
        need = c["decides_at"]["items"]
        distance = max(abs(c["estimate"] - c["bar"]["value"]), PAPER_GAIN)
        assert need == pytest.approx(n * (se / (distance / 2.8)) ** 2, rel=0.02)
        assert f"about {need:,} test problems (this run: {n})" in v.summary
    assert "here at this run's pace" in v.summary
