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
