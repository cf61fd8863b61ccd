"""Generated planning tasks with long, verbose step-by-step traces (the latent study's default offline data).

Two tasks, each a stand-in for the paper's from-scratch settings (Su et al. 2502.03275: a Keys-Finding
Maze and ProsQA, traces of hundreds of tokens whose early words "support textual coherence rather than
core reasoning"):

`turtle` (the default), a walk steered by turns:

    Question: start 2 1 facing up . moves : left forward forward right forward ... . where do you end ?
    Chain:    we start at 2 1 facing up and make 8 moves : left forward forward right forward ... . we go one
              move at a time . left face left at 2 1 . forward left at 2 0 . forward left wall at 2 0 .
              right face up at 2 0 . forward up at 1 0 . ...
    Answer:   1 0

A 4 x 4 grid whose border is a wall, 8 moves (left and right turn in place, forward steps one cell the way the
walker faces, or is blocked by the wall). Every step restates the whole state (heading and position), so each
step needs only the one before it and the prompt: a 2-layer model trained from scratch on the chains learns it in
a few hundred steps, while the answer alone needs the whole walk composed in one pass (an answer-only model
stays far below CoT; on the `walk` task below it came too close to CoT for the chain to be needed). The chain opens with a plan that restates the prompt (about 28 tokens of
"coherence" text, a third of the chain) and runs about 83 tokens in all.

`walk`, a maze-style grid walk (absolute moves; kept as an option):

    Question: start 3 3 . moves : left right down down left ... . where do you end ?
    Chain:    we start at 3 3 and make 8 moves : left , right , down , ... . we go one move at a time .
              go left from 3 3 , now at 3 2 . ... go down from 5 2 , wall , stay at 5 2 .
    Answer:   5 2

A 6 x 6 grid whose border is a wall; 7-9 moves; a move into the wall is blocked and the trace says so. The
trace (110-150 tokens) opens with a plan that restates the start and the moves (about 35 tokens of text
that "supports coherence": the prompt says all of it), then restates every move and the position it
starts from, so most of its words are copied from the prompt or the previous step; only the new position
of each step is computed. The answer is the last position. Latent codes that replace the plan lose nothing
the rest needs; codes that reach into the steps must carry the position (36 states, about 5 bits) for the
text to continue, which one code of a 64-entry codebook can hold.

`classes`, ProsQA-style class chains: "A is B ." facts (every A is a B) of three chains of 8-10 links plus a
few side classes, shuffled; Tom belongs to the bottom class of one chain; the answer is the class at its
top, and the trace walks up one link per step ("every kelpus is a bompus , so tom is a bompus ."). Every
step is a lookup among about 30 shuffled facts; a small model trained from scratch for a few minutes on a CPU
answers almost none of the test problems, so it needs a GPU budget and is not the default.

Both mark the words a step computes (`computed`: indices into the chain's words); the rest are copied.
Unlike the maze, neither task backtracks: the trace is long, but the search is a chain of steps a small
model trained for a few minutes on 2 cores can learn. Splits are disjoint by construction: a problem is
identified by its content, assigned to one split by a seeded hash (the same rule as the arithmetic task).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lmlab.data.generated.reasoning import generate_disjoint
from lmlab.errors import LmlabError

_ONSETS = ["b", "d", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y", "z", "br", "gr", "sh", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u"]
CLASSES = [f"{o}{v}mpus" for o in _ONSETS for v in _VOWELS]  # 100 made-up class words, one token each
NAMES = ["tom", "ann", "max", "eva", "sam", "ida", "leo", "mia"]


@dataclass(frozen=True)
class Problem:
    question: str
    steps: tuple[str, ...]  # "go left from 3 3 , now at 3 2 ."
    answer: str
    key: tuple
    computed: tuple[int, ...] = ()  # indices into chain.split() of the words a step looks up (not copied)

    @property
    def chain(self) -> str:
        return " ".join(self.steps)


DIRECTIONS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def _walk(rng: random.Random, size: int, min_moves: int, max_moves: int) -> Problem:
    x, y = rng.randrange(size), rng.randrange(size)
    moves = [rng.choice(list(DIRECTIONS)) for _ in range(rng.randint(min_moves, max_moves))]
    question = f"start {x} {y} . moves : {' '.join(moves)} . where do you end ?"
    steps = [f"we start at {x} {y} and make {len(moves)} moves : {' , '.join(moves)} . we go one move at a time ."]
    computed: list[int] = []
    words = len(steps[0].split())
    for move in moves:
        dx, dy = DIRECTIONS[move]
        nx, ny = x + dx, y + dy
        if 0 <= nx < size and 0 <= ny < size:
            step = f"go {move} from {x} {y} , now at {nx} {ny} ."
            computed += [words + 8, words + 9]
            x, y = nx, ny
        else:
            step = f"go {move} from {x} {y} , wall , stay at {x} {y} ."
            computed.append(words + 6)  # "wall" is what the step finds out; the position is copied
        steps.append(step)
        words += len(step.split())
    return Problem(question, tuple(steps), f"{x} {y}", (question,), tuple(computed))


HEADINGS = ["up", "right", "down", "left"]  # clockwise: a right turn adds 1


def _turtle(rng: random.Random, size: int, min_moves: int, max_moves: int, plan: bool = True) -> Problem:
    x, y, h = rng.randrange(size), rng.randrange(size), 0
    moves = [rng.choice(["left", "right", "forward", "forward"]) for _ in range(rng.randint(min_moves, max_moves))]
    question = f"start {x} {y} facing up . moves : {' '.join(moves)} . where do you end ?"
    steps = [f"we start at {x} {y} facing up and make {len(moves)} moves : {' '.join(moves)} . "
             f"we go one move at a time ."] if plan else []
    computed: list[int] = []
    words = len(steps[0].split()) if plan else 0
    for move in moves:
        if move != "forward":
            h = (h + (1 if move == "right" else 3)) % 4
            step = f"{move} face {HEADINGS[h]} at {x} {y} ."
            computed.append(words + 2)
        else:
            dx, dy = DIRECTIONS[HEADINGS[h]]
            if 0 <= x + dx < size and 0 <= y + dy < size:
                x, y = x + dx, y + dy
                step = f"forward {HEADINGS[h]} at {x} {y} ."
                computed += [words + 3, words + 4]
            else:
                step = f"forward {HEADINGS[h]} wall at {x} {y} ."
                computed.append(words + 2)  # "wall" is what the step finds out; the position is copied
        steps.append(step)
        words += len(step.split())
    return Problem(question, tuple(steps), f"{x} {y}", (question,), tuple(computed))


def generate_turtle_problems(n_train: int, n_dev: int, n_test: int, seed: int = 0, size: int = 4,
                             min_moves: int = 8, max_moves: int = 8, plan: bool = True) -> dict[str, list[Problem]]:
    """Disjoint train/dev/test sets of turtle walks (turns and steps relative to a heading), the same for the
    same seed. `plan` False: the chain starts at the first move, without the plan that restates the prompt, so
    its early tokens are steps whose results the rest of the walk needs."""
    if size < 2 or not 1 <= min_moves <= max_moves or size > 10:
        raise LmlabError("the turtle walk needs 2 <= size <= 10 and 1 <= min_moves <= max_moves")
    return _generate(lambda rng: _turtle(rng, size, min_moves, max_moves, plan), n_train, n_dev, n_test, seed)


def generate_walk_problems(n_train: int, n_dev: int, n_test: int, seed: int = 0, size: int = 6,
                           min_moves: int = 7, max_moves: int = 9) -> dict[str, list[Problem]]:
    """Disjoint train/dev/test sets of grid walks, the same for the same seed."""
    if size < 2 or not 1 <= min_moves <= max_moves or size > 10:
        raise LmlabError("the walk needs 2 <= size <= 10 and 1 <= min_moves <= max_moves")
    return _generate(lambda rng: _walk(rng, size, min_moves, max_moves), n_train, n_dev, n_test, seed)


def _generate(make, n_train: int, n_dev: int, n_test: int, seed: int) -> dict[str, list[Problem]]:
    return generate_disjoint(make, n_train, n_dev, n_test, seed, tries_per_problem=20)


def _problem(rng: random.Random, chains: int, min_len: int, max_len: int, side: int) -> Problem:
    lengths = [rng.randint(min_len, max_len) for _ in range(chains)]
    names = rng.sample(CLASSES, sum(lengths) + chains + side)
    parent: dict[str, str] = {}
    bottoms, tops, members = [], [], []
    at = 0
    for n in lengths:
        chain = names[at:at + n + 1]  # bottom ... top
        at += n + 1
        for child, up in zip(chain, chain[1:]):
            parent[child] = up
        bottoms.append(chain[0])
        tops.append(chain[-1])
        members.extend(chain[1:])
    for leaf in names[at:at + side]:  # side classes hang off chain members above the bottom
        parent[leaf] = rng.choice(members)
    facts = [f"{c} is {p} ." for c, p in parent.items()]
    rng.shuffle(facts)
    who = rng.choice(NAMES)
    pick = rng.randrange(chains)
    start = bottoms[pick]
    question = " ".join(facts) + f" {who} is a {start} . what is {who} at the top ?"
    steps = [f"{who} is a {start} ."]
    computed: list[int] = []
    words = len(steps[0].split())
    node = start
    while node in parent:
        up = parent[node]
        computed.append(words + 4)  # every NODE is a UP
        step = f"every {node} is a {up} , so {who} is a {up} ."
        steps.append(step)
        words += len(step.split())
        node = up
    steps.append(f"nothing is above {node} .")
    key = (tuple(sorted(parent.items())), start, who)
    return Problem(question, tuple(steps), node, key, tuple(computed))


def generate_class_problems(n_train: int, n_dev: int, n_test: int, seed: int = 0, chains: int = 3,
                            min_len: int = 8, max_len: int = 10, side: int = 3) -> dict[str, list[Problem]]:
    """Disjoint train/dev/test sets of class-chain problems, the same for the same seed."""
    if chains < 1 or not 1 <= min_len <= max_len or side < 0:
        raise LmlabError("the class-chain task needs chains >= 1, 1 <= min_len <= max_len and side >= 0")
    if chains * (max_len + 1) + side > len(CLASSES):
        raise LmlabError(f"{chains} chains of up to {max_len} links and {side} side classes need more than the "
                         f"{len(CLASSES)} class words")
    return _generate(lambda rng: _problem(rng, chains, min_len, max_len, side), n_train, n_dev, n_test, seed)
