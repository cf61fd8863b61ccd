"""Run directories: one per (study, model, config), written atomically, resumable.

    runs/knockout-smollm2-135m-3f2a9c1b7d/
        config.yaml   the full config (its hash names the folder)
        tables/NAME.csv, tables/NAME.parquet   the named tidy tables (studies/result.py)
        meta.json, verdict.json, figure.png / figure.svg, log.txt, manifest.json
        partial/*.jsonl   results of finished work units, appended as they finish (one file per process
                          when a study runs over several, see lmlab.parallel)

A study asks `run.done(part)` for the units already finished and `run.record(part, key, rows)` after
each unit; a killed run, restarted with the same config, lands in the same folder and skips them.
Final files are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import yaml

from lmlab import parallel
from lmlab.errors import LmlabError
from lmlab.files import atomic_write


def config_hash(config: dict) -> str:
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "model"


def study_run(path: str | Path, study: str) -> tuple[Path, dict]:
    """A finished or unfinished run folder of `study` (its manifest's study, else its name) and its config.yaml;
    one sentence otherwise."""
    path = Path(path).expanduser()
    manifest = path / "manifest.json"
    named = json.loads(manifest.read_text()).get("study") if manifest.is_file() else None
    if not (path / "config.yaml").is_file() or (named or "") != study and not (named is None and
                                                                                 path.name.startswith(study + "-")):
        raise LmlabError(f"{path} is not a {study} run folder ({study}-...)")
    return path, yaml.safe_load((path / "config.yaml").read_text())


# --- the models a run folder holds for other commands (compare, export, lm-eval) to load: each layout named once,
# where the study writes it and where another reads it


def packed_student(run: str | Path, name: str) -> Path:
    """Where a quantize run packs its student `name` (the cell's key, e.g. "2bit-A-rep0")."""
    return Path(run) / "packed" / f"{name}.safetensors"


def packed_students(run: str | Path) -> list[Path]:
    """A quantize run's packed students so far, by name."""
    return sorted((Path(run) / "packed").glob("*.safetensors"))


def holds_packed_students(run: str | Path) -> bool:
    return (Path(run) / "packed").is_dir()


def sparse_model_folder(run: str | Path, replicate: int) -> Path:
    """The folder of a sparse-circuits run's post-trained model of `replicate` (an HF folder; its training record,
    sparse_training.json, beside it)."""
    return Path(run) / "post_training" / f"rep{replicate}" / "sparse_model"


def sparse_model_folders(run: str | Path) -> list[tuple[int, Path]]:
    """A sparse-circuits run's post-trained models so far: (replicate, folder), by replicate."""
    found = [(int(f.parent.name[3:]), f) for f in (Path(run) / "post_training").glob("rep*/sparse_model")]
    return sorted(found)


def holds_sparse_models(run: str | Path) -> bool:
    return (Path(run) / "post_training").is_dir()


class RunDir:
    """The folder of one study run. `RunDir.open(root, study, model, config_dict)`."""

    def __init__(self, path: Path, study: str, config: dict):
        self.path, self.study, self.config = Path(path), study, config
        self._t0 = time.perf_counter()
        self.tag: str | None = None  # the weights' fingerprint that joined the folder's name (open)
        self.meta: dict = {}  # what the run counted and chose (describe), written as meta.json with its tables

    @staticmethod
    def folder(root: str | Path, study: str, model: str, config: dict, tag: str | None = None) -> Path:
        """Where the run of `config` lives under `root`; `tag` (e.g. the weights' fingerprint of a model passed in)
        joins the folder's hash, not the config."""
        return (Path(root).expanduser()
                / f"{study}-{slug(model)}-{config_hash(config if tag is None else {**config, '_weights': tag})}")

    @classmethod
    def open(cls, root: str | Path, study: str, model: str, config: dict, tag: str | None = None) -> "RunDir":
        """The run folder of `config` under `root` (`folder`), made if new; its config.yaml must match."""
        root = Path(root).expanduser()
        path = cls.folder(root, study, model, config, tag)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-test{parallel.world()[0]}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise LmlabError(f"cannot write to the output directory {root}: {exc.strerror or exc}") from exc
        run = cls(path, study, config)
        run.tag = tag
        cfg_file = path / "config.yaml"
        if cfg_file.exists():  # (processes of one launch may all write it: the same bytes, renamed atomically)
            if yaml.safe_load(cfg_file.read_text()) != json.loads(json.dumps(config, default=str)):
                raise LmlabError(f"{path} holds a run with a different config; use another --out")
        else:
            atomic_write(cfg_file, yaml.safe_dump(json.loads(json.dumps(config, default=str)), sort_keys=False))
        return run

    def beside(self, model: str, config: dict) -> "RunDir | None":
        """The run of `config` in the same --out folder, on the same weights, where one was started (read only: for
        units another run finished that this one may take over); None where there is none."""
        path = self.folder(self.path.parent, self.study, model, config, self.tag)
        cfg_file = path / "config.yaml"
        if path == self.path or not cfg_file.is_file():
            return None
        if yaml.safe_load(cfg_file.read_text()) != json.loads(json.dumps(config, default=str)):
            return None
        return RunDir(path, self.study, config)

    def describe(self, **facts) -> None:
        """What the run counted and chose (the questions it asked, the examples a task kept, the sizes it took), kept
        apart from its measured tables: the result's metadata (`StudyResult.info`, meta.json). A resumed run
        describes itself again, from the same inputs."""
        self.meta.update({k: v.item() if hasattr(v, "item") else v for k, v in facts.items()})

    # --- progress of a long run
    def _partial(self, part: str) -> Path:
        """This process's file of `part` (one file per process when several share the run)."""
        rank, size = parallel.world()
        return self.path / "partial" / (f"{slug(part)}.rank{rank}.jsonl" if size > 1 else f"{slug(part)}.jsonl")

    def done(self, part: str) -> dict[str, list[dict]]:
        """Finished units of `part`, by any process of this or an earlier session: key -> rows. A torn last line
        (killed mid-write) is ignored."""
        folder = self.path / "partial"
        files = [folder / f"{slug(part)}.jsonl"] + sorted(folder.glob(f"{slug(part)}.rank*.jsonl"))
        out: dict[str, list[dict]] = {}
        for file in files:
            if not file.exists():
                continue
            for line in file.read_text().splitlines():
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out[str(item["key"])] = item["rows"]
        return out

    def record(self, part: str, key: Any, rows: list[dict]) -> None:
        """Append one finished unit; durable before returning."""
        file = self._partial(part)
        file.parent.mkdir(parents=True, exist_ok=True)
        at = datetime.now(timezone.utc).isoformat(timespec="seconds")  # logged_seconds: a killed session counts to here
        line = (json.dumps({"key": str(key), "rows": rows, "at": at}, default=_jsonable) + "\n").encode()
        try:
            with open(file, "a+b") as fh:
                if fh.tell() and (fh.seek(-1, os.SEEK_END), fh.read(1))[1] != b"\n":
                    line = b"\n" + line  # a line torn by a kill ends here: this unit starts a line of its own
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:  # (a torn line is ignored by done() and closed by the next append)
            raise OSError(exc.errno, exc.strerror, str(file)) from exc

    # --- final artefacts
    def write_figure(self, figure, name: str = "figure") -> Path:
        for ext in ("png", "svg"):
            buf = io.BytesIO()
            figure.savefig(buf, format=ext, dpi=130 if ext == "png" else None, bbox_inches="tight")
            atomic_write(self.path / f"{name}.{ext}", buf.getvalue())
        return self.path / f"{name}.png"

    def write_json(self, name: str, payload: dict) -> Path:
        atomic_write(self.path / name, json.dumps(payload, indent=2, default=_jsonable))
        return self.path / name

    def log(self, message: str) -> None:
        """A line in log.txt (rank 0's; another process of a launch writes log.rankR.txt)."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        rank = parallel.world()[0]
        with open(self.path / ("log.txt" if rank == 0 else f"log.rank{rank}.txt"), "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {message}\n")

    def logged_seconds(self, now: datetime | None = None) -> float:
        """Wall time over every session of this run: each session runs from its "start" line in log.txt to its
        last sign of work, a log line or a unit recorded in partial/ (a killed session's lost tail is not counted;
        a study that logs nothing between its start and its end still counts its units), the current one up to
        `now`."""
        stamps = self._log_stamps() + [(stamp, False) for stamp in self._unit_stamps()]
        if now is not None:
            stamps.append((now, False))
        total, begin, last = 0.0, None, None
        for stamp, is_start in sorted(stamps, key=lambda s: (s[0], not s[1])):  # a start opens its second
            if is_start:
                if begin is not None:
                    total += (last - begin).total_seconds()
                begin = stamp
            last = stamp
        if begin is not None:
            total += (last - begin).total_seconds()
        return total

    def _log_stamps(self) -> list[tuple[datetime, bool]]:
        """(time, is a "start" line) for each line of log.txt."""
        path = self.path / "log.txt"
        stamps: list[tuple[datetime, bool]] = []
        for line in (path.read_text(encoding="utf-8").splitlines() if path.exists() else []):
            stamp = _utc(line.split(" ", 1)[0])
            if stamp is not None:
                stamps.append((stamp, line.split(" ", 2)[1:2] == ["start"]))
        return stamps

    def _unit_stamps(self) -> list[datetime]:
        """When each unit in partial/ was recorded (rows written before units carried their time have none)."""
        stamps = []
        for file in sorted((self.path / "partial").glob("*.jsonl")):
            for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
                at = re.search(r'"at": "([^"]+)"}\s*$', line)  # the last field; a unit's rows are not parsed
                stamp = _utc(at.group(1)) if at else None
                if stamp is not None:
                    stamps.append(stamp)
        return stamps

    def finish(self, status: str = "complete", **extra) -> None:
        if not parallel.is_main():  # rank 0 alone writes the run's files
            return
        manifest = {"study": self.study, "status": status, "config_hash": config_hash(self.config),
                    "seconds": round(time.perf_counter() - self._t0, 1),
                    "finished": datetime.now(timezone.utc).isoformat(), **extra}
        self.write_json("manifest.json", manifest)

    def has_progress(self) -> bool:
        """Anything besides the config and the log: a recorded unit, a checkpoint, an artefact."""
        return any(p.name != "config.yaml" and not p.name.startswith((".", "log.")) for p in self.path.iterdir())

    def fail(self, reason: str) -> None:
        """A run that stopped on an error. With nothing to resume from its folder is removed (a failed command
        leaves no empty run behind); otherwise it is marked failed with the reason, and resumes when rerun."""
        if not parallel.is_main():
            self.log(f"failed: {reason}")
            return
        if not self.has_progress():
            shutil.rmtree(self.path, ignore_errors=True)
            return
        self.log(f"failed: {reason}")
        self.finish(status="failed", reason=reason)

    @property
    def complete(self) -> bool:
        manifest = self.path / "manifest.json"
        return manifest.exists() and json.loads(manifest.read_text()).get("status") == "complete"

    def files(self) -> Iterable[Path]:
        return sorted(p for p in self.path.iterdir() if p.is_file() and not p.name.startswith("."))


def _utc(text: str) -> datetime | None:
    """A log line's stamp (2026-01-01T10:00:00Z) or a unit's (ISO with its offset), in UTC; None if neither."""
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "as_dict"):
        return value.as_dict()
    return str(value)
