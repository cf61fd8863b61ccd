"""Answer normalisation and matching, shared by the QA and math studies.

`normalize_answer` is SQuAD's: lower case, drop punctuation and the articles a/an/the, fold white
space. `last_boxed` takes the content of the last \\boxed{...} with nested braces. `normalize_number`
makes "1,234", "-3", "3/4", "0.750" and "\\frac{3}{4}" comparable.
"""

from __future__ import annotations

import re
import string
from fractions import Fraction
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def alias_match(prediction: str, aliases: Iterable[str], exact: bool = False) -> bool:
    """True when a normalised gold alias occurs in the normalised prediction, on word boundaries; with `exact`
    (a closed class of answers, such as continents), only when the normalised prediction is one ("South Asia" does
    not answer "Asia")."""
    norm = normalize_answer(prediction)
    pred = f" {norm} "
    for alias in aliases:
        gold = normalize_answer(alias)
        if gold and (norm == gold if exact else f" {gold} " in pred):
            return True
    return False


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), nested braces allowed; None if absent/unclosed."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start:i - 1].strip()
    return None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_number(text: str) -> str | None:
    """The last number in free text (thousands separators, decimals, a/b fractions allowed)."""
    found = _NUMBER.findall(text.replace("\u2212", "-"))
    return found[-1] if found else None


def normalize_number(text: str | None) -> str | None:
    """Canonical string of a number, or the cleaned text when it is not one."""
    if text is None:
        return None
    t = text.strip().strip("$ .").replace("\u2212", "-")
    t = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"(\1)/(\2)", t)
    t = re.sub(r"\\(?:left|right|!|,|;)", "", t).replace("{", "").replace("}", "")
    t = t.replace("\\%", "").replace("%", "")
    compact = t.replace(",", "").replace(" ", "")
    m = re.fullmatch(r"\(?(-?\d+(?:\.\d+)?)\)?(?:/\(?(-?\d+(?:\.\d+)?)\)?)?", compact)
    if not m:
        return " ".join(t.split())
    try:
        value = Fraction(m.group(1)) / (Fraction(m.group(2)) if m.group(2) else 1)
    except (ZeroDivisionError, ValueError):
        return compact
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def math_equal(prediction: str | None, gold: str) -> bool:
    if prediction is None:
        return False
    return normalize_number(prediction) == normalize_number(gold)
