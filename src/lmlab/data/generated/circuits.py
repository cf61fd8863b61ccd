"""Clean/corrupted prompt pairs for circuit discovery (sparse-circuits), generated from templates, seeded.

Every pair has the same length in tokens (the corruption swaps single tokens), so activations of the
two runs line up position by position for patching.

    ioi           "When Mary and John went to the store, John gave a drink to" -> Mary vs John.
                  Corrupted: the second mention of the subject becomes the other name, so the
                  right answer flips. Metric: logit(answer) - logit(distractor).
    greater-than  "The war lasted from the year 1732 to the year 17" -> a year above 1732. Metric: the
                  probability mass on continuations above the start year minus below it. With a
                  digit-splitting tokenizer (Llama-3 / SmolLM2 style) the next token is the tens digit,
                  so the metric is p(tens digit > X) - p(tens digit < X) for start year 17XY (DECISION:
                  the digit-level form of the paper's two-digit metric). Corrupted: the start year's tens
                  digit becomes 0 (1702), as in Hanna et al.'s "01" corruption.
    docstring     A Python function whose docstring documents two of its three parameters, ending in
                  ":param" -> the third. Corrupted: the second documented parameter is the third
                  argument, so the answer becomes the second argument. Metric: logit difference.
    ioi-long      IOI with 3-5 filler sentences (about 60 tokens) between the names and the end.
    induction     The field's most studied circuit (Olsson et al. 2022): a sequence of 8 random common words, then
                  its first 2-7 words again -> the word that followed them the first time. Corrupted: the first
                  copy becomes 8 other words, so nothing earlier says what comes next. Metric: logit(answer) -
                  logit(distractor), the distractor a word of neither copy. Not one of Draye et al.'s four
                  (`TASKS`): compare reads it beside them (`ALL_TASKS`).

Every answer must be a single token of the model's tokenizer; otherwise the error names the token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from lmlab.errors import LmlabError

if TYPE_CHECKING:  # torch is imported where it is used: the CLI reads TASKS without it
    import torch

NAMES = ["Mary", "John", "Alice", "Bob", "Tom", "James", "Sarah", "Emma", "David", "Paul", "Anna", "Kate", "Mark",
         "Lisa", "Peter", "Laura", "Michael", "Susan", "Daniel", "Rachel", "Robert", "Linda", "George", "Helen"]
PLACES = ["store", "park", "school", "garden", "station", "market", "office", "beach", "library", "restaurant"]
OBJECTS = ["drink", "book", "ring", "bag", "letter", "ball", "basket", "computer", "snack", "kiss"]
IOI_TEMPLATES = [
    "When {A} and {B} went to the {place}, {S} gave a {obj} to",
    "After {A} and {B} arrived at the {place}, {S} handed a {obj} to",
    "While {A} and {B} were working at the {place}, {S} gave a {obj} to",
    "Then, {A} and {B} had a long walk to the {place}. {S} gave a {obj} to",
    "When {A} and {B} got a {obj} at the {place}, {S} decided to give it to",
]
LONG_OPEN = "When {A} and {B} went to the {place},"
LONG_CLOSE = " Afterwards, {S} gave a {obj} to"
FILLER = [
    " it was a warm afternoon and the streets were full of people walking slowly in the sun.",
    " The shops along the road had opened their doors early, and music was playing from a radio.",
    " A group of children were playing football in the square next to the old fountain.",
    " The weather had been cold all week, but that day the sky was clear and bright.",
    " Several cars were waiting at the crossing while a bus stopped to let its passengers out.",
    " Somebody was selling fresh bread and fruit from a small wooden stand near the corner.",
    " The whole neighbourhood seemed busier than usual because of the festival that weekend.",
    " An old man sat on a bench reading his newspaper and feeding the pigeons around him.",
]
NOUNS = ["Event", "Request", "Image", "Record", "Message", "Report", "Task", "Account"]
VERBS = ["load", "send", "update", "create", "check", "render", "parse", "store", "merge", "fetch"]
PARAMS = ["name", "value", "path", "size", "data", "key", "index", "count", "mode", "text", "user", "file",
          "color", "width", "height", "order", "source", "target", "limit", "label", "port", "token", "url"]
DESCRIPTIONS = ["the {p} to use", "the {p} of the {n}", "which {p} applies", "a {p} for the {n}",
                "the new {p}", "how the {p} is set"]

TASKS = ("ioi", "greater-than", "docstring", "ioi-long")  # Draye et al.'s four (sparse-circuits)
ALL_TASKS = TASKS + ("induction",)  # compare's: the four and the induction task
# induction's words: common nouns that are one token (after a space) in most tokenizers; the task keeps those the
# model's tokenizer holds as one
WORDS = ["apple", "river", "table", "horse", "window", "garden", "paper", "music", "doctor", "island", "market",
         "winter", "summer", "money", "letter", "forest", "bridge", "camera", "planet", "engine", "castle", "silver",
         "dinner", "coffee", "flower", "mountain", "village", "student", "teacher", "animal", "ocean", "bottle",
         "pencil", "kitchen", "button", "rocket", "jacket", "candle", "mirror", "ticket", "basket", "hammer",
         "wallet", "pocket", "tiger", "rabbit", "monkey", "dragon", "orange", "lemon", "butter", "cheese", "bread",
         "chair", "clock", "cloud", "stone", "sugar", "glass", "plate", "train", "truck", "phone", "piano"]
INDUCTION_LENGTH = 8  # words in the sequence that repeats


@dataclass(frozen=True)
class CircuitPrompt:
    clean: tuple[int, ...]
    corrupted: tuple[int, ...]
    clean_text: str
    corrupted_text: str
    answer: int = -1  # logit-difference tasks: the right token and the distractor
    distractor: int = -1
    above: tuple[int, ...] = ()  # greater-than: the continuations above / below the start year
    below: tuple[int, ...] = ()


@dataclass
class CircuitTask:
    name: str
    metric: str  # "logit_diff" or "prob_diff"
    prompts: list[CircuitPrompt] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, idx) -> "CircuitTask":
        return CircuitTask(self.name, self.metric, [self.prompts[i] for i in idx])


def single_token(tokenizer, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise LmlabError(f"the model's tokenizer splits {text!r} into {len(ids)} tokens; this task needs it as one "
                         "token")
    return ids[0]


def _encode(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text)["input_ids"])


def _pair(tokenizer, clean: str, corrupted: str, **answers) -> CircuitPrompt:
    a, b = _encode(tokenizer, clean), _encode(tokenizer, corrupted)
    if len(a) != len(b):
        raise LmlabError(f"clean and corrupted prompts tokenize to different lengths ({len(a)} vs {len(b)}): "
                         f"{clean!r} / {corrupted!r}")
    return CircuitPrompt(a, b, clean, corrupted, **answers)


def _ioi(tokenizer, rng: random.Random, long: bool) -> CircuitPrompt:
    io, s = rng.sample(NAMES, 2)
    first, second = (io, s) if rng.random() < 0.5 else (s, io)  # ABB and BAB orders
    slots = dict(A=first, B=second, place=rng.choice(PLACES), obj=rng.choice(OBJECTS))
    if long:
        filler = "".join(rng.sample(FILLER, rng.randint(3, 5)))
        template = LONG_OPEN + filler + LONG_CLOSE
    else:
        template = rng.choice(IOI_TEMPLATES)
    clean = template.format(S=s, **slots)
    corrupted = template.format(S=io, **slots)  # the subject's second mention becomes the other name
    return _pair(tokenizer, clean, corrupted, answer=single_token(tokenizer, " " + io),
                 distractor=single_token(tokenizer, " " + s))


def _digit_mode(tokenizer) -> bool:
    return len(tokenizer("1732", add_special_tokens=False)["input_ids"]) == 4


def _greater_than(tokenizer, rng: random.Random) -> CircuitPrompt:
    noun = rng.choice(["war", "drought", "journey", "reign", "expedition", "strike", "famine", "dispute"])
    verb = rng.choice(["lasted", "went on", "continued"])
    century = rng.choice(["16", "17", "18"])
    tens, ones = rng.randint(2, 8), rng.randint(1, 9)
    template = "The {noun} {verb} from the year {century}{yy} to the year {century}"
    clean = template.format(noun=noun, verb=verb, century=century, yy=f"{tens}{ones}")
    corrupted = template.format(noun=noun, verb=verb, century=century, yy=f"0{ones}")
    if _digit_mode(tokenizer):
        digits = [single_token(tokenizer, str(d)) for d in range(10)]
        above, below = tuple(digits[tens + 1:]), tuple(digits[:tens])
    else:  # two-digit year tokens (GPT-2 style): years above / below the start year
        start = tens * 10 + ones
        years = [single_token(tokenizer, f"{y:02d}") for y in range(100)]
        above, below = tuple(years[start + 1:]), tuple(years[:start])
    return _pair(tokenizer, clean, corrupted, above=above, below=below)


def _docstring(tokenizer, rng: random.Random) -> CircuitPrompt:
    a, b, c = rng.sample(PARAMS, 3)
    noun, verb = rng.choice(NOUNS), rng.choice(VERBS)
    fn = f"{verb}_{noun.lower()}"
    d1, d2 = rng.sample(DESCRIPTIONS, 2)

    def text(second: str) -> str:
        return (f"def {fn}(self, {a}, {b}, {c}):\n"
                f'    """{verb.capitalize()} the {noun.lower()}.\n\n'
                f"    :param {a}: {d1.format(p=a, n=noun.lower())}\n"
                f"    :param {second}: {d2.format(p=second, n=noun.lower())}\n"
                f"    :param")

    return _pair(tokenizer, text(b), text(c), answer=single_token(tokenizer, " " + c),
                 distractor=single_token(tokenizer, " " + b))


def induction_words(tokenizer) -> list[tuple[str, int]]:
    """(" word", token id) for each of WORDS that the tokenizer holds as one token after a space."""
    out = []
    for w in WORDS:
        ids = tokenizer(" " + w, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            out.append((" " + w, ids[0]))
    if len(out) < 2 * INDUCTION_LENGTH + 1:
        raise LmlabError(f"the induction task needs {2 * INDUCTION_LENGTH + 1} of its common words as one token each; "
                         f"this tokenizer holds {len(out)} so")
    return out


def _induction(tokenizer, rng: random.Random, words: list[tuple[str, int]]) -> CircuitPrompt:
    picked = rng.sample(words, 2 * INDUCTION_LENGTH + 1)
    first, other, distractor = picked[:INDUCTION_LENGTH], picked[INDUCTION_LENGTH:-1], picked[-1]
    k = rng.randint(2, INDUCTION_LENGTH - 1)
    repeat = "".join(w for w, _ in first[:k])
    return _pair(tokenizer, "".join(w for w, _ in first) + repeat, "".join(w for w, _ in other) + repeat,
                 answer=first[k][1], distractor=distractor[1])


FILE_PREFIX = "file:"  # a task name `file:PATH`: the user's own prompt pairs (read_pairs)
PAIR_KEYS = ("clean", "corrupted", "answer", "distractor")


def pairs_file(name: str):
    """The path of a `file:PATH` task name (None for a generated task)."""
    from pathlib import Path

    return Path(name[len(FILE_PREFIX):]).expanduser() if name.startswith(FILE_PREFIX) else None


def read_pair_rows(path) -> list[dict]:
    """The rows of a prompt-pair file (JSON Lines: clean, corrupted, answer, distractor, all text), checked without a
    tokenizer; a bad file or row is one sentence naming the line."""
    import json

    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        raise LmlabError(f"cannot read the prompt pairs {path}: {exc.strerror or exc}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LmlabError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        missing = [k for k in PAIR_KEYS if not isinstance(row, dict) or not isinstance(row.get(k), str)]
        if missing:
            raise LmlabError(f"{path}:{number}: a prompt pair needs the texts {', '.join(PAIR_KEYS)}; "
                             f"'{missing[0]}' is missing or not text")
        rows.append(row)
    if not rows:
        raise LmlabError(f"{path}: no prompt pairs in it (one JSON object a line: {', '.join(PAIR_KEYS)})")
    return rows


def read_pairs(path, tokenizer, n: int | None = None) -> CircuitTask:
    """A task from the user's prompt pairs (the first `n`, or all): metric the answer's logit minus the distractor's at
    the last position, as IOI's; the answer and distractor must each be one token, the two prompts of a pair the same
    number of tokens (patching is position by position)."""
    from pathlib import Path

    rows = read_pair_rows(path)[:n] if n else read_pair_rows(path)
    task = CircuitTask(Path(path).stem, "logit_diff")
    for number, row in enumerate(rows, 1):
        try:
            task.prompts.append(_pair(tokenizer, row["clean"], row["corrupted"],
                                      answer=single_token(tokenizer, row["answer"]),
                                      distractor=single_token(tokenizer, row["distractor"])))
        except LmlabError as exc:
            raise LmlabError(f"{path}, pair {number}: {exc}") from None
    return task


def make_task(name: str, tokenizer, n: int, seed: int = 0) -> CircuitTask:
    """`n` clean/corrupted pairs of task `name`, the same for the same seed (`file:PATH`: the first `n` of the user's
    pairs, read_pairs)."""
    if pairs_file(name) is not None:
        return read_pairs(pairs_file(name), tokenizer, n)
    if name not in ALL_TASKS:
        raise LmlabError(f"unknown circuit task '{name}'; registered tasks: {', '.join(ALL_TASKS)}")
    if n < 1:
        raise LmlabError("a circuit task needs at least one prompt")
    rng = random.Random(f"{name}|{seed}")
    words = induction_words(tokenizer) if name == "induction" else []
    build = {"ioi": lambda: _ioi(tokenizer, rng, long=False), "ioi-long": lambda: _ioi(tokenizer, rng, long=True),
             "greater-than": lambda: _greater_than(tokenizer, rng), "docstring": lambda: _docstring(tokenizer, rng),
             "induction": lambda: _induction(tokenizer, rng, words)}
    task = CircuitTask(name, "prob_diff" if name == "greater-than" else "logit_diff")
    task.prompts = [build[name]() for _ in range(n)]
    return task


def task_metric(logits: torch.Tensor, prompts: list[CircuitPrompt], metric: str) -> torch.Tensor:
    """Per-prompt metric from the last position's logits (B, V): logit or probability difference."""
    import torch

    if metric == "logit_diff":
        answer = torch.tensor([p.answer for p in prompts], device=logits.device)
        distractor = torch.tensor([p.distractor for p in prompts], device=logits.device)
        return logits.gather(1, answer[:, None])[:, 0] - logits.gather(1, distractor[:, None])[:, 0]
    probs = torch.softmax(logits.float(), dim=-1)
    out = []
    for row, p in zip(probs, prompts):
        out.append(row[list(p.above)].sum() - row[list(p.below)].sum())
    return torch.stack(out)


def task_correct(logits: torch.Tensor, prompts: list[CircuitPrompt], metric: str) -> torch.Tensor:
    """Whether each prompt is answered right: answer above distractor, or more mass above than below."""
    return task_metric(logits, prompts, metric) > 0
