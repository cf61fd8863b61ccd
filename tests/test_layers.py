"""The house: every import of src/lmlab (at the top of a file or in a function) runs down the floors of
docs/layers.md or stays on its floor, none closes a circle, no study imports another study, a study's
measurements never import its analysis, and no function runs over 60 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
SRC = ROOT / "src"
SHARED = {"lmlab.studies", "lmlab.studies.config", "lmlab.studies.figures", "lmlab.studies.registry",
          "lmlab.studies.result", "lmlab.studies.runner", "lmlab.studies.runtime", "lmlab.studies.verdict"}


def floors() -> dict[str, int]:
    """{module prefix: floor} from the table of docs/layers.md."""
    out = {}
    for line in (ROOT / "docs" / "layers.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([^`]+)`", cells[1]):
                out["lmlab" if name == "lmlab" else f"lmlab.{name}"] = int(cells[0])
    return out


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "lmlab").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The lmlab modules `name` imports, each resolved to the module that holds it."""
    def resolve(target: str) -> str:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("lmlab")}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            module = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
            if module.startswith("lmlab"):
                found |= {resolve(f"{module}.{a.name}") if f"{module}.{a.name}" in known else resolve(module)
                          for a in node.names}
    return found - {name, ""}


def floor_of(name: str, table: dict[str, int]) -> int:
    best = max((p for p in table if name == p or name.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{name} is on no floor of docs/layers.md"
    return table[best]


def study_of(name: str) -> str | None:
    parts = name.split(".")
    return ".".join(parts[:3]) if len(parts) >= 3 and parts[1] == "studies" and name not in SHARED else None


def test_imports_run_down_the_floors_of_docs_layers():
    table, known = floors(), modules()
    up, across = [], []
    for name, path in known.items():
        for target in imports(name, path, known):
            if floor_of(target, table) > floor_of(name, table):
                up.append(f"{name} (floor {floor_of(name, table)}) imports {target} (floor {floor_of(target, table)})")
            if study_of(name) and study_of(target) and study_of(name) != study_of(target):
                across.append(f"{name} imports {target}")
    assert not up, up
    assert not across, across


def is_analysis(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last == "analysis" or last.endswith("_analysis")


def test_measurements_never_import_their_analysis():
    """Data flows one way: a study's recipe.py and measure.py, and every module of its package they reach, never
    import an analysis module (analysis.py or a *_analysis.py): what is derived from the measurements is the
    analysis' to make, when a run finishes and when it is re-judged."""
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    back = []
    for start in (n for n in known if study_of(n) and n.rpartition(".")[2] in ("recipe", "measure")):
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in graph.get(node, ()):
                if study_of(nxt) == study_of(start) and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        back += [f"{start} reaches {n}" for n in sorted(seen) if is_analysis(n)]
    assert len([n for n in known if study_of(n) and n.endswith(".recipe")]) >= 6
    assert not back, back


def test_no_import_closes_a_circle():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, circles


def test_no_function_is_over_sixty_lines():
    """A function a reader can hold: none in src/lmlab runs over 60 lines (docstring included)."""
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, long


def may_import() -> dict[str, list[str]]:
    """{a study's file: the module prefixes docs/extending.md's table says it may import}: each backticked name, with
    `lmlab.` put before a bare one; "what `F` may" takes F's row too; "its own X" names the study's own module (the
    study's package is always its own)."""
    out = {}
    for line in (ROOT / "docs" / "extending.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+\.py`", cells[0]):
            column = re.sub(r"its own `\w+`( and `\w+`)?", "", cells[2].split(";")[0])
            inherits = re.match(r"what `(\w+\.py)` may", column)
            column = column[inherits.end():] if inherits else column
            out[cells[0].strip("`")] = ([n if n.startswith("lmlab") else f"lmlab.{n}"
                                         for n in re.findall(r"`([^`]+)`", column)]
                                        + (out[inherits.group(1)] if inherits else []))
    return out


def test_a_studys_files_import_what_docs_extending_says_they_may():
    """Each study's config, measure, recipe and analysis imports only what docs/extending.md's "may import" column
    names (and its own package): the table a reader adds a study by is the one the code keeps."""
    allowed, known = may_import(), modules()
    assert {"config.py", "measure.py", "recipe.py", "analysis.py"} <= set(allowed)
    bad = []
    for name, path in known.items():
        study = study_of(name)
        if study is None or path.name not in allowed or name.count(".") != 3:
            continue
        for target in imports(name, path, known):
            if not (target.startswith(study + ".") or target == study
                    or any(target == p or target.startswith(p + ".") for p in allowed[path.name])):
                bad.append(f"{name} imports {target}")
    assert not bad, "not in docs/extending.md's 'may import' column: " + "; ".join(sorted(bad))
