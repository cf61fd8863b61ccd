"""Compare's placebo: the original with its circuit's heads moved to other heads of the same layers.

The variant `swap` is the original with each of a task's top-k heads exchanged, in the weights, with a head outside
the top-k of the same layer (lmlab.interventions.permute: the query, key, value and output slices move together, so
the model computes exactly what it did and answers exactly as before, its circuit at other head indices); `swap:half`
moves half of them, every other head of the top-k ranking (the 1st, 3rd, 5th, ...; one that cannot leave the top-k
positions replaced by the next one down that can) and leaves the others in place, so half the circuit is kept. A
variant whose computation is the original's but whose circuit sits elsewhere must come out "does not keep"; one that
keeps half of it must never come out "keeps".

The heads moved are the original's top-k ranked on prompt pairs of the task other than the ones the overlap is
judged on (`measure.selection_task`), so the control is not "moves exactly the heads it then reads": where the
original's ranking does not carry over to other prompts, the swap misses heads of the circuit it is judged on, and
the placebo can fail (the verdict says how many of the moved heads are in the top-k it reads).

Grouped-query attention (a KV group's heads share one key and value): a head can be exchanged within its group (its
query and output slices), or whole groups exchanged (their key and value too). `moves` chooses, per layer, the
exchange of groups (an assignment problem, solved exactly) and then the exchanges within each group that leave the
fewest moved heads on a top-k position, keeping the heads not moved where they are. A moved head that cannot leave
(a layer or group with more top heads than others) is reported as stuck, never hidden.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

Head = tuple[int, int]

HALF = "half"


def moved_heads(top: Sequence[Head], how: str, n_heads: int = 0, n_kv: int = 0) -> list[Head]:
    """The heads a swap variant moves: all of the top-k (`how` ""), or half of them ("half": ceil(k / 2)): every other
    one in the ranking (the 1st, 3rd, 5th, ...), a head that could not leave the top-k positions with the others
    (its layer or KV group too full, given `n_heads` and `n_kv`) replaced by the next one down the ranking that can,
    so that half the circuit moves wherever half of it can."""
    top = [tuple(map(int, h)) for h in top]
    if how != HALF:
        return top
    want = (len(top) + 1) // 2
    order = top[::2] + top[1::2]
    if not n_heads:
        return order[:want]
    chosen: list[Head] = []
    for head in order:
        if len(chosen) == want:
            break
        if not moves(top, chosen + [head], n_heads, n_kv)[1]:
            chosen.append(head)
    for head in order:  # where fewer can move cleanly, the rest as the ranking has them (reported as stuck)
        if len(chosen) == want:
            break
        if head not in chosen:
            chosen.append(head)
    return sorted(chosen, key=top.index)


def _group_costs(top_l: set, move_l: list, kept: set, n_heads: int, n_kv: int) -> np.ndarray:
    """The cost of new position group g taking old KV group s (rows g, columns s): the moved heads of s that find no
    position outside the top-k in g; groups holding a kept top head stay in place, and an exchange of groups costs a
    little more than staying, so it happens only where it helps."""
    size = n_heads // n_kv
    t = [sum(h // size == g for h in move_l) for g in range(n_kv)]
    kappa = [sum(h // size == g for h in kept) for g in range(n_kv)]
    free = [size - sum(h // size == g for h in top_l) for g in range(n_kv)]
    cost = np.full((n_kv, n_kv), 10.0 * n_heads)
    for g in range(n_kv):
        for s in range(n_kv):
            if g == s:
                cost[g, s] = max(0, t[s] - free[g])
            elif kappa[g] == 0 and kappa[s] == 0:
                cost[g, s] = max(0, t[s] - free[g]) + 1e-3
    return cost


def _placed(g: int, s: int, size: int, top_l: set, move_l: list, kept: set) -> tuple[dict[int, int], list[int]]:
    """Old group s's heads in new group g's positions ({position: old head}): kept top heads in place, each moved
    head at a position outside the top-k, the rest in order; and the moved heads that found no such position (they
    stay, in place where they can)."""
    slots = list(range(g * size, (g + 1) * size))
    heads = list(range(s * size, (s + 1) * size))
    taken: dict[int, int] = {}
    if g == s:
        taken.update({h: h for h in kept if h // size == g})
    outside = [p for p in slots if p not in top_l]
    stuck = []
    for h in (h for h in move_l if h // size == s):
        spot = next((p for p in outside if p not in taken), None)
        if spot is None:
            spot = h if g == s and h not in taken else next(p for p in slots if p not in taken)
            stuck.append(h)
        taken[spot] = h
    rest = [h for h in heads if h not in taken.values()]
    for p in slots:
        if p not in taken:
            taken[p] = rest.pop(0)
    return taken, stuck


def moves(top: Sequence[Head], moved: Sequence[Head], n_heads: int, n_kv: int) -> tuple[dict[int, list[int]],
                                                                                      list[Head]]:
    """Per layer, the head permutation (new head j computes old head perm[j]) that sends each head of `moved` to a
    position outside `top`, leaves the other top heads in place and keeps each KV group's heads together; and the
    moved heads that could not leave the top positions (stuck). Layers with nothing to move are left out."""
    from scipy.optimize import linear_sum_assignment

    size = n_heads // n_kv
    top, moved = [tuple(map(int, h)) for h in top], [tuple(map(int, h)) for h in moved]
    perms: dict[int, list[int]] = {}
    stuck: list[Head] = []
    for layer in sorted({l for l, _ in moved}):
        top_l = {h for l, h in top if l == layer}
        move_l = [h for l, h in moved if l == layer]  # in ranking order
        kept = top_l - set(move_l)
        rows, cols = linear_sum_assignment(_group_costs(top_l, move_l, kept, n_heads, n_kv))
        perm = list(range(n_heads))
        for g, s in zip(rows, cols):
            taken, left = _placed(g, s, size, top_l, move_l, kept)
            stuck += [(layer, h) for h in left]
            for p, h in taken.items():
                perm[p] = h
        if perm != list(range(n_heads)):
            perms[layer] = perm
    return perms, stuck


def where_now(perms: dict[int, list[int]], head: Head) -> Head:
    """Where an old head's computation sits after the permutation."""
    layer, h = head
    perm = perms.get(layer)
    return (layer, h if perm is None else perm.index(h))
