"""S3 · Meaningless tokens and the Activation Redistribution Module (Shi et al., arXiv 2510.01032), seed 003.

Recipe (METHODS.md S3):
 - prompt = instruction ("Please reason step by step, and put your final answer within \\boxed{}.")
   + inserted tokens + problem; Mless = 55 x " /", Mful = 55 x " he", between the instruction and the
   problem by default, inside the user turn for chat-template models. Prompts are assembled from token
   ids, so each inserted token lands exactly where asked (and is exactly one token);
 - greedy decoding with a token budget (quick 48 new tokens, full 384: DECISION, to fit CPU minutes;
   the table records how often an answer ran into the budget, because brevity is a confound);
 - scoring: the last \\boxed{} of the output, else its last number, normalised, against the gold answer;
 - sweeps on a subset: insertion length (0 to 70) and position (before / between / after);
 - attention profile of one layer-0 head (default: the head whose profile changes most between None
   and Mless), mean attention each key receives from later queries, sink excluded; inserted positions
   removed for the aligned None/Mless/Mful plot, kept for the long Mless/Mful plot;
 - mechanism check: share of near-zero layer-0 MLP activations (|a| < 0.01) on the original tokens;
 - ARM in layer 0, (c, p1) tuned on a disjoint dev split, reported on the test split.
"""

from __future__ import annotations

import random

import pandas as pd
from pydantic import Field

from lmlab.data.math import MathItem, read_math_file, split_arithmetic
from lmlab.data.scoring import last_boxed, last_number, math_equal
from lmlab.errors import LmlabError
from lmlab.generation import greedy_answers
from lmlab.interventions import intervene
from lmlab.interventions.arm import ActivationRedistribution
from lmlab.models import LoadedModel, load_model
from lmlab.runs import RunDir
from lmlab.studies.base import StudyConfig, StudySpec, register
from lmlab.studies.filler_analysis import figure, profile_and_mechanism_rows, verdict

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
FILLERS = {"Mless": " /", "Mful": " he"}
PROFILES = {"quick": dict(n_test_per_level=20, n_dev_per_level=4, max_new_tokens=48, sweep_problems=12),
            "full": dict(n_test_per_level=200, n_dev_per_level=40, max_new_tokens=384, sweep_problems=200)}


class Config(StudyConfig):
    benchmark: str = Field("arithmetic", description="arithmetic, or gsm8k:PATH / math500:PATH")
    n_test_per_level: int | None = Field(None, description="test problems per level (quick 20, full 200)")
    n_dev_per_level: int | None = Field(None, description="dev problems per level for tuning ARM (quick 4)")
    max_new_tokens: int | None = Field(None, description="generation budget (quick 48, full 384)")
    sweep_problems: int | None = Field(None, description="test problems used in the sweeps (quick 12)")
    insert_count: int = 55
    sweep_lengths: list[int] = Field(default_factory=lambda: [10, 25, 40, 70])
    profile_problems: int = 24
    profile_layer: int = 0
    head: int | None = Field(None, description="head for the profile (default: the one that changes most)")
    arm_layer: int = 0
    arm_c: list[float] = Field(default_factory=lambda: [0.13, 0.32])
    arm_p1: list[float] = Field(default_factory=lambda: [90.0, 99.5])
    batch_size: int = Field(64, description="prompts generated together (64: a chunk in one batch; decoding is "
                                           "bound by reading the weights, so 64 rows cost 21% less than 2 x 32)")

    def size(self, name: str):
        value = getattr(self, name)
        return PROFILES[self.profile][name] if value is None else value


def build_ids(lm: LoadedModel, question: str, filler: str | None = None, count: int = 55,
              position: str = "between") -> tuple[list[int], list[int]]:
    """Prompt token ids and the positions of the inserted tokens (token-level assembly)."""
    if position not in ("before", "between", "after"):
        raise LmlabError(f"insertion position must be before, between or after, not '{position}'")
    tok = lm.tokenizer
    if tok.chat_template:
        rendered = tok.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False,
                                           add_generation_prompt=True)
        head, tail = rendered.split("\x00")
    else:
        head, tail = "", "\nAnswer:"
    fill = tok(filler, add_special_tokens=False)["input_ids"] * count if filler and count else []
    parts = [head, "FILL" if position == "before" else None, INSTRUCTION, "FILL" if position == "between" else None,
             "\n" + question, "FILL" if position == "after" else None, tail]
    ids: list[int] = [] if tok.chat_template else tok("", add_special_tokens=True)["input_ids"]
    inserted: list[int] = []
    for part in parts:
        if part == "FILL":
            inserted = list(range(len(ids), len(ids) + len(fill)))
            ids += fill
        elif part:
            ids += tok(part, add_special_tokens=False)["input_ids"]
    return ids, inserted


def spread(items: list[MathItem], n: int) -> list[MathItem]:
    """n items taken evenly through the list (the test split is ordered by level, so all levels appear)."""
    step = max(1, len(items) // max(n, 1))
    return items[::step][:n]


def score(text: str, answer: str) -> tuple[int, str | None]:
    pred = last_boxed(text) or last_number(text)
    return int(math_equal(pred, answer)), pred


def load_problems(config: Config) -> tuple[list[MathItem], list[MathItem], int]:
    if config.benchmark == "arithmetic":
        dev, test = split_arithmetic(config.size("n_dev_per_level"), config.size("n_test_per_level"), config.seed)
        return dev, test, 0
    kind, _, path = config.benchmark.partition(":")
    if not path:
        raise LmlabError(f"unknown benchmark '{config.benchmark}'; use arithmetic, gsm8k:PATH or math500:PATH")
    items, skipped = read_math_file(kind, path)
    random.Random(config.seed).shuffle(items)
    n_dev = min(len(items) // 5, 5 * config.size("n_dev_per_level"))
    return items[:n_dev], items[n_dev:n_dev + 5 * config.size("n_test_per_level")], skipped


def _evaluate(lm, run_dir, items, condition, config, filler=None, count=0, position="between", arm=None,
              split="test", sweep="") -> list[dict]:
    """Generate and score one condition, resumable in chunks of 64 problems."""
    key_base = f"{split}|{condition}|{sweep}"
    done = run_dir.done("answers")
    rows = []
    for start in range(0, len(items), 64):
        key = f"{key_base}|{start}"
        if key not in done:
            chunk = items[start:start + 64]
            prompts = [build_ids(lm, item.question, filler, count, position)[0] for item in chunk]
            desc = f"{split} {condition} {sweep} {start + len(chunk)}/{len(items)}"
            if arm is not None:
                with intervene(lm, ActivationRedistribution(layers=[config.arm_layer], seed=config.seed, **arm)):
                    outs = greedy_answers(lm, prompts, config.size("max_new_tokens"), config.batch_size,
                                          stop_at_newline=False, description=desc, share_prefix=False)
            else:
                outs = greedy_answers(lm, prompts, config.size("max_new_tokens"), config.batch_size,
                                      stop_at_newline=False, description=desc)
            new = []
            for item, out in zip(chunk, outs):
                text = lm.tokenizer.decode(out, skip_special_tokens=True)
                correct, pred = score(text, item.answer)
                new.append(dict(kind="answer", split=split, condition=condition, sweep=sweep, id=item.id,
                                level=item.level, correct=correct, pred=pred, gold=item.answer,
                                new_tokens=len(out), hit_budget=int(len(out) >= config.size("max_new_tokens"))))
            run_dir.record("answers", key, new)
            done[key] = new
        rows += done[key]
    return rows


def run(config: Config, run_dir: RunDir) -> pd.DataFrame:
    lm = load_model(config.model)
    if not lm.layout.causal:
        raise LmlabError(f"{lm.name} is not a causal language model; the filler study generates text")
    dev, test, skipped = load_problems(config)
    run_dir.log(f"{len(dev)} dev and {len(test)} test problems; {skipped} rows skipped")
    n = config.insert_count
    rows: list[dict] = []

    # ARM: tune (c, p1) on dev
    tuning = []
    for c in config.arm_c:
        for p1 in config.arm_p1:
            got = _evaluate(lm, run_dir, dev, "ARM", config, arm=dict(c=c, p1=p1), split="dev", sweep=f"c={c},p1={p1}")
            tuning.append(dict(kind="tuning", c=c, p1=p1, dev_accuracy=sum(r["correct"] for r in got) / len(got)))
    best = max(tuning, key=lambda r: r["dev_accuracy"])
    for row in tuning:
        row["chosen"] = int(row is best)
    rows += tuning + _evaluate(lm, run_dir, dev, "w/o", config, split="dev")

    # the four test conditions
    rows += _evaluate(lm, run_dir, test, "w/o", config)
    for name, filler in FILLERS.items():
        rows += _evaluate(lm, run_dir, test, name, config, filler, n)
    rows += _evaluate(lm, run_dir, test, "ARM", config, arm=dict(c=best["c"], p1=best["p1"]))

    # sweeps on a subset (length 0 and 55-between reuse the main conditions)
    subset = spread(test, config.size("sweep_problems"))
    for length in config.sweep_lengths:
        rows += _evaluate(lm, run_dir, subset, "Mless", config, FILLERS["Mless"], length, sweep=f"length={length}")
    for name, filler in FILLERS.items():
        for position in ("before", "after"):
            rows += _evaluate(lm, run_dir, subset, name, config, filler, n, position, sweep=f"position={position}")

    # attention profiles and the mechanism check
    probe = spread(test, config.profile_problems)
    prompts = {cond: [build_ids(lm, item.question, FILLERS.get(cond), n if cond in FILLERS else 0) for item in probe]
               for cond in ("None", "Mless", "Mful")}
    rows += profile_and_mechanism_rows(lm, prompts, config.profile_layer, config.head)
    rows.append(dict(kind="counts", model=lm.name, dev=len(dev), test=len(test), skipped_rows=skipped,
                     max_new_tokens=config.size("max_new_tokens"), insert_count=n,
                     arm_c=best["c"], arm_p1=best["p1"]))
    return pd.DataFrame(rows)


SPEC = register(StudySpec(name="filler", title="S3 · Meaningless tokens and the Activation Redistribution Module",
                          paper="Shi et al., arXiv 2510.01032", seed_file="003_1081a18ae74e4138.txt", config=Config,
                          run=run, figure=figure, verdict=verdict, default_model="smollm2-135m",
                          seed_summary=("Math-500 accuracy w/o, w/ Mless, w/ Mful: Qwen2.5-Math-1.5B about 64 / 66 / 66%, "
                                        "Qwen2.5-Math-7B about 73 / 76 / 74%, Llama-3.1-8B-Instruct about 44 / 46 / 48%. "
                                        "Average attention on head 14: inserted tokens lower the peaks on the original "
                                        "tokens."),
                          summary=lambda t: key_rows(t)))


def key_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per condition (test split), for the report."""
    a = table[(table.kind == "answer") & (table.split == "test") & (table.sweep.fillna("") == "")]
    out = a.groupby("condition").agg(problems=("correct", "size"), accuracy=("correct", "mean"),
                                     hit_budget=("hit_budget", "mean")).reset_index()
    out["accuracy"] = (100 * out.accuracy).round(1)
    return out
