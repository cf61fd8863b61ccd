"""`lmlab results RUN_DIR...`: the record of measured runs, generated from their run folders.

Each finished run folder gives one record: the study, its model(s), profile, seed and replicates, whether it ran
at the profile's sizes, its verdict and the line that decided it (whose claim, its interval and bar, or the
validity check that kept it open), its run time over every session, the machine (CPU, AVX-512 or not, cores,
threads, load average; or the GPU), lmlab's version and when it finished. Nothing is typed in by hand.

- The records are kept in a JSON-lines file (`--records`); a run read again replaces its own record (same run
  folder name and finish time), so the file keeps the runs whose folders are gone.
- The Markdown page (`--out`) is rendered from every record: the latest run of each study, profile and seed first, then
  every run by study, newest first.
- The timings file (`--timings`, the one `lmlab reproduce` reads to order the studies and estimate the time left)
  takes, for each study and profile, the run time of its latest record made with the study's default model at the
  profile's own sizes (a run with a size changed on the command line times something else).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


from lmlab.render import headline
from lmlab.environment import machine
from lmlab.errors import LmlabError
from lmlab.files import atomic_write, splice

TIMINGS = Path(__file__).with_name("timings.json")


@dataclass
class Record:
    study: str
    run: str  # the run folder's name
    model: str
    profile: str
    seed: int
    seeds: int | None
    sizes: str  # "profile" (the profile's own sizes) or the sizes set on the command line
    verdict: str
    decided: str
    seconds: float
    machine: str
    gpu: str | None
    lmlab: str | None
    finished: str
    environment: dict = field(default_factory=dict)
    placebo: bool = False  # the study's placebo (its treatment replaced by one that cannot have the effect)

    @property
    def key(self) -> tuple[str, str]:
        return self.run, self.finished


def _size_fields(study: str) -> set[str]:
    """The study's sizes: every field its profiles.yaml names, and every field its code reads through
    `config.size(...)` (a size no profile sets, such as the latent study's --moves, still makes a run's sizes its
    own, not the profile's)."""
    import re

    from lmlab.studies import STUDIES
    from lmlab.studies.config import load_profiles

    spec = STUDIES[study]
    package = spec.config.__module__.rpartition(".")[0]
    table = load_profiles(package)
    names: set[str] = set()
    for profile in ("demo", "quick", "full"):
        names |= set(table.get(profile) or {})
    for variant in (table.get("variants") or {}).values():
        for sizes in variant.values():
            names |= set(sizes or {})
    folder = Path(__import__(package, fromlist=["_"]).__file__).parent
    for source in folder.rglob("*.py"):
        names |= set(re.findall(r"\.size\(\s*\"(\w+)\"", source.read_text(encoding="utf-8")))
    return names & set(spec.config.model_fields)


def _set_away(config, name: str) -> bool:
    """Whether a run set size `name` to other than its profile's value (a value equal to the profile's is the profile's
    own run: an older run that recorded a setting which has since become a size, the latent study's codebook 64,
    stays the profile's)."""
    value = getattr(config, name)
    return value is not None and value != config.model_copy(update={name: None}).size(name)


def _set_knobs(config) -> list[str]:
    """The study's own scalar settings a run set away from their defaults (the latent study's --chunk 8), which
    change what was measured as a size does."""
    from lmlab.studies.config import StudyConfig

    fields = type(config).model_fields
    return sorted(k for k, f in fields.items() if k not in StudyConfig.model_fields and k not in _size_fields_of(config)
                  and isinstance(getattr(config, k), (bool, int, float, str)) and getattr(config, k) != f.default)


def _size_fields_of(config) -> set[str]:
    from lmlab.studies import STUDIES

    return next((_size_fields(name) for name, spec in STUDIES.items() if spec.config is type(config)), set())


def read_record(run: Path) -> Record:
    """One finished run folder's record; one sentence when the folder holds no finished run."""
    from lmlab.studies import STUDIES
    from lmlab.studies.result import read_config

    manifest_file, verdict_file, config_file = run / "manifest.json", run / "verdict.json", run / "config.yaml"
    if not (manifest_file.is_file() and verdict_file.is_file() and config_file.is_file()):
        raise LmlabError(f"{run} holds no finished study run (manifest.json, verdict.json and config.yaml)")
    manifest = json.loads(manifest_file.read_text())
    if manifest.get("status") != "complete":
        raise LmlabError(f"{run} is not complete ({manifest.get('status')}): rerun its command to finish it")
    study = manifest.get("study", "")
    if study not in STUDIES:
        raise LmlabError(f"{run} is a run of '{study}', which is not a study of this lmlab")
    config = read_config(run, STUDIES[study], manifest.get("model", ""))
    overall = json.loads(verdict_file.read_text())["overall"]
    changed = sorted(k for k in _size_fields(study) if _set_away(config, k)) + _set_knobs(config)
    env = manifest.get("environment") or {}
    if not env and manifest.get("children"):  # a several-model run: its first child ran on the same machine
        child = Path(manifest["children"][0]) / "manifest.json"
        env = json.loads(child.read_text()).get("environment", {}) if child.is_file() else {}
    return Record(study=study, run=run.name, model=config.model, profile=config.profile, seed=config.seed,
                  seeds=config.seeds,
                  sizes=", ".join([f"{k} {getattr(config, k)}" for k in changed] or ["profile"])
                  + (f", dtype {config.dtype}" if config.dtype != "auto" else ""),
                  verdict=overall["status"], decided=headline(overall["status"], overall.get("evidence", {})),
                  seconds=float(manifest.get("run_seconds", manifest.get("seconds", 0.0)) or 0.0),
                  machine=machine(env) if env else "not recorded", gpu=env.get("gpu"), lmlab=env.get("lmlab"),
                  finished=str(manifest.get("finished", "")), environment=env, placebo=config.placebo)


def run_folders(paths: list[Path]) -> list[Path]:
    """The finished run folders in `paths` (a run folder itself, or a folder of them such as reproduce's --out)."""
    found: list[Path] = []
    for path in paths:
        path = Path(path).expanduser()
        if not path.exists():
            raise LmlabError(f"no run folder at {path}")
        if (path / "manifest.json").is_file():
            found.append(path)
        else:
            found += sorted(p.parent for p in path.glob("*/manifest.json"))
    if not found:
        raise LmlabError(f"no finished run folders under {', '.join(map(str, paths))}")
    return found


def load_records(path: Path) -> list[Record]:
    if not path.is_file():
        return []
    return [Record(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def merge(records: list[Record], new: list[Record]) -> list[Record]:
    """`records` with `new` added; a record of the same run and finish time is replaced. Oldest first."""
    keys = {r.key for r in new}
    return sorted([r for r in records if r.key not in keys] + new, key=lambda r: r.finished)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(records: list[Record], command: str) -> str:
    """The Markdown page: the latest run of each study, profile and seed (its placebo's under it), then every run by
    study."""
    from lmlab.studies import STUDIES

    order = {name: i for i, name in enumerate(STUDIES)}
    lines = ["# Results", "",
             "Generated from the records of finished run folders by `lmlab results` (the last time: "
             f"`{command}`); do not edit by hand. Each row is one finished run: its",
             "verdict and the line that decided it, the run time over its sessions, and the machine it ran on (a load",
             "average above the threads means the cores were shared, so the time is not a timing). \"sizes\" says",
             "whether the run used the profile's own sizes or which it set.", ""]
    latest: dict[tuple[str, str, bool, str, int, bool], Record] = {}
    for r in records:  # records are oldest first; a run at sizes of its own never stands for the profile's
        latest[(r.study, r.profile, r.sizes != "profile", r.sizes, r.seed, r.placebo)] = r
    lines += ["## The latest run of each study, profile and seed (a run at sizes of its own in a row of its own)", "",
              "A study's placebo (the same run with its treatment replaced by one that cannot have the paper's effect) "
              "sits under it: it should never read \"reproduced\".", "",
              "| study | profile | seed | verdict | what decided it | time | machine |", "|---|---|---|---|---|---|---|"]
    for (study, profile, _, _, _, placebo), r in sorted(latest.items(), key=lambda kv: (order.get(kv[0][0], 99),
                                                                                         *kv[0][1:])):
        lines.append(f"| {study}{' · placebo' if placebo else ''} | {profile}{'' if r.sizes == 'profile' else ' (' + _cell(r.sizes) + ')'} | {r.seed} | "
                     f"**{r.verdict}** | {_cell(r.decided)} | {_duration(r.seconds)} | {_cell(r.gpu or r.machine)} |")
    for study in sorted({r.study for r in records}, key=lambda s: order.get(s, 99)):
        spec = STUDIES.get(study)
        lines += ["", f"## {spec.title if spec else study}", "",
                  "| finished | model | profile | seed | replicates | sizes | verdict | what decided it | time | machine "
                  "| lmlab |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted((r for r in records if r.study == study), key=lambda r: r.finished, reverse=True):
            lines.append(f"| {r.finished[:16].replace('T', ' ')} | {_cell(r.model)} | "
                         f"{r.profile}{' · placebo' if r.placebo else ''} | {r.seed} | "
                         f"{r.seeds if r.seeds is not None else 'profile'} | {_cell(r.sizes)} | **{r.verdict}** | "
                         f"{_cell(r.decided)} | {_duration(r.seconds)} | {_cell(r.gpu or r.machine)} | "
                         f"{r.lmlab or ''} |")
    return "\n".join(lines) + "\n"


# the README's results table: (column title, profile, seeds, placebo); each cell the latest run of the study's default
# model at the profile's own sizes (a precision set on the command line allowed: it changes no size)
FRONT_COLUMNS = (("demo, seed 0", "demo", (0,), False), ("its placebo, seed 0", "demo", (0,), True),
                 ("demo, seeds 1 and 2", "demo", (1, 2), False), ("quick, seeds 0-2", "quick", (0, 1, 2), False),
                 ("quick placebo, seed 0", "quick", (0,), True))


def _front_latest(records: list[Record]) -> dict[tuple[str, str, int, bool], Record]:
    from lmlab.studies import STUDIES

    latest: dict[tuple[str, str, int, bool], Record] = {}
    for r in records:  # oldest first: a later run replaces an earlier one
        spec = STUDIES.get(r.study)
        at_profile = r.sizes == "profile" or r.sizes.startswith("profile, dtype ")
        if spec is not None and at_profile and r.model == spec.default_model and not r.gpu:
            latest[(r.study, r.profile, r.seed, r.placebo)] = r
    return latest


def _short(text: str, limit: int) -> str:
    """`text` cut after its last whole clause (at "; ") within `limit` characters, marked by an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text.rfind("; ", 0, limit)
    return (text[:cut] if cut > 0 else text[:limit].rpartition(" ")[0]) + "; …"


def _front_line(decided: str) -> str:
    """What decided a run, for a table cell: the claim's line and whose it is (its source's words left to
    docs/results.md), or a validity check's first clauses."""
    for mark, whose in (("; the paper's claim", " (the paper's claim)"), ("; a claim of ours", " (a claim of ours)")):
        if mark in decided:
            return _short(decided.split(mark)[0], 360) + whose
    return _short(decided, 200)


def _front_cell(runs: list[tuple[int, Record | None]]) -> str:
    found = [(seed, r) for seed, r in runs if r is not None]
    if not found:
        return "not run"
    many = len(runs) > 1
    return "; ".join(f"{f'seed {seed}: ' if many else ''}**{r.verdict}**" + (f": {_cell(_front_line(r.decided))}" if r.decided else "")
                     + f" ({r.finished[:10]}{'' if r.sizes == 'profile' else ', ' + r.sizes.partition(', ')[2]})"
                     for seed, r in found)


def front_table(records: list[Record]) -> str:
    """The README's results table, from the records: a row per study (its default model), a column per
    FRONT_COLUMNS entry, each cell the verdict and the line that decided it, with the day the run finished."""
    from lmlab.studies import STUDIES

    latest = _front_latest(records)
    lines = ["| study | " + " | ".join(title for title, *_ in FRONT_COLUMNS) + " |",
             "|---|" + "---|" * len(FRONT_COLUMNS)]
    for name, spec in STUDIES.items():
        cells = [_front_cell([(seed, latest.get((name, profile, seed, placebo))) for seed in seeds])
                 for _, profile, seeds, placebo in FRONT_COLUMNS]
        lines.append(f"| `lmlab {name}`, {spec.default_model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def front_sample(records: list[Record], study: str = "knockout") -> str:
    """The end of what `lmlab STUDY --profile demo` prints, as its latest seed-0 demo run recorded it."""
    from lmlab.studies import STUDIES

    r = _front_latest(records).get((study, "demo", 0, False))
    if r is None:
        return ""
    return (f"{STUDIES[study].title}: {r.verdict}\n" + (f"decided by: {r.decided}\n" if r.decided else "")
            + "the whole verdict: …\n" + f"outputs in runs/{r.run} (lmlab report runs/{r.run} draws it as HTML)\n")


def spliced_readme(text: str, records: list[Record]) -> str:
    """The README with its results table and its sample output made from the records."""
    return splice(splice(text, "results", front_table(records)), "sample", "```\n" + front_sample(records) + "```\n")


def timings(records: list[Record]) -> dict:
    """{study: {profile: {seconds, machine, seed, finished}}} from the latest record of each study and profile run
    with the study's default model at the profile's sizes, on a CPU (a GPU's time says nothing of a CPU's)."""
    from lmlab.studies import STUDIES

    out: dict[str, dict] = {}
    for r in records:
        spec = STUDIES.get(r.study)
        if spec is None or r.sizes != "profile" or r.model != spec.default_model or r.gpu or r.placebo:
            continue
        out.setdefault(r.study, {})[r.profile] = {"seconds": round(r.seconds), "machine": r.machine,
                                                  "seed": r.seed, "finished": r.finished}
    return out


def load_timings(path: Path = TIMINGS) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def update(paths: list[Path], records_file: Path, out: Path | None, timings_file: Path | None,
           command: str, readme: Path | None = None) -> list[Record]:
    """Read the run folders, merge their records into `records_file`, render `out`, update `timings_file`
    (entries of studies and profiles these records do not time are kept) and `readme`'s results table and sample
    output (`spliced_readme`)."""
    new = [read_record(p) for p in run_folders(paths)] if paths else []
    records = merge(load_records(records_file), new)
    atomic_write(records_file, "".join(json.dumps(asdict(r), sort_keys=True) + "\n" for r in records))
    if out is not None:
        atomic_write(out, render(records, command))
    if timings_file is not None:
        table = load_timings(timings_file)
        for study, profiles in timings(records).items():
            table.setdefault(study, {}).update(profiles)
        atomic_write(timings_file, json.dumps(table, indent=1, sort_keys=True) + "\n")
    if readme is not None:
        atomic_write(readme, spliced_readme(readme.read_text(encoding="utf-8"), records))
    return new
