"""A whole study over several processes: `accelerate launch -m lmlab <study> ...` (or `torchrun -m lmlab ...`).

The launcher starts N copies of the same command and sets RANK / WORLD_SIZE / LOCAL_RANK; accelerate's
`PartialState` joins them into one process group (gloo on CPU, NCCL on GPUs). lmlab adds nothing of its
own to that: no scheduler, no queue. What it adds is the rule each study follows with its work units
(questions, generation calls, prompt pairs):

- `mine(n)`: process r takes units r, r + N, r + 2N, ... of the *whole* list, in order (never of the units
  still to do, which differ between processes while they record), so the split is the same on every process
  and on every resumed session.
- every process records its finished units in its own file (`partial/<part>.rank<r>.jsonl`, see
  `RunDir.record`); `RunDir.done` reads every process's file, so a resumed run skips what any process finished.
- `sync()` waits for every process (a barrier) before a phase reads all the units of the last one.
- `main_only()` marks where the rest of the study (fitting, tables, the verdict, the figure) runs on rank 0
  alone: the other processes stop there, and rank 0 writes the run folder.

Training (the latent study's models, the quantize study's students, the sparse-circuits study's post-training) runs
data-parallel inside `lmlab.train.train` (accelerate DDP): every process runs it, each on its slice of every global
batch.
"""

from __future__ import annotations

import os
from datetime import timedelta


class Follower(Exception):
    """Raised on a process other than rank 0 where the rest of the study is rank 0's alone (`main_only`)."""


def world() -> tuple[int, int]:
    """(rank, number of processes), from the launcher's environment; (0, 1) when run alone."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed() -> bool:
    return world()[1] > 1


def is_main() -> bool:
    return world()[0] == 0


def _state():
    """accelerate's process state (joins the process group once; a day's timeout, as a rank may wait at a barrier
    while another finishes a long share)."""
    from accelerate import PartialState

    import torch

    return PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(hours=24))


def local_device() -> str | None:
    """The device of this process under a launcher (cuda:LOCAL_RANK on a GPU machine), None when run alone."""
    if not is_distributed():
        return None
    import torch

    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    """Every process waits here for the others (a no-op when run alone)."""
    if is_distributed():
        _state().wait_for_everyone()


def mine(index: int) -> bool:
    """Whether unit number `index` of a study's fixed unit list is this process's."""
    rank, size = world()
    return index % size == rank


def group_size() -> int:
    """Processes in the joined process group (1 when none is joined; a collective needs one joined)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_sum(values) -> list[float]:
    """The sums of `values` over every process of the group (float64; the values themselves when alone). Every
    process must call it at the same point."""
    values = [float(v) for v in values]
    if group_size() == 1:
        return values
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_state().device)
    dist.all_reduce(t)
    return t.tolist()


def sum_(t):
    """`t` (a tensor) summed over every process of the group, in place (itself when alone)."""
    if group_size() > 1:
        import torch.distributed as dist

        dist.all_reduce(t)
    return t


def from_main(t):
    """Rank 0's values of `t` (a tensor) on every process, in place (itself when alone): for a step that draws
    random numbers inside training (a codebook's restart), drawn once, on rank 0, whose stream is one process's."""
    if group_size() > 1:
        import torch.distributed as dist

        dist.broadcast(t, src=0)
    return t


def gather_batch(t):
    """The rows of the whole global batch, in its order, from each process's slice of it (process r holds global
    rows r, r + N, ...; `lmlab.train.train` splits batches so); every slice has the same number of rows. Alone: t.
    Every process must call it at the same point."""
    n = group_size()
    if n == 1:
        return t
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous())
    return torch.stack(parts, 1).reshape(-1, *t.shape[1:])  # row i of process r is global row i * N + r


def main_first(compute):
    """`compute()` on rank 0, then, once it is done, on every other process: for a step that writes a file the
    run reuses (sampled text), so it is made once and read by the rest. Returns compute()'s value everywhere."""
    if is_main():
        value = compute()
        sync()
        return value
    sync()
    return compute()


def share_out(n: int, compute) -> list:
    """`compute(indices)` over this process's share of items 0..n-1 (r, r + N, ...; a list of one result per
    index), the results of every share gathered back in item order on every process (alone: compute(0..n-1)).
    Every process must call it at the same point."""
    rank, size = world()
    local = list(compute(list(range(rank, n, size))))
    if size == 1:
        return local
    import torch.distributed as dist

    _state()  # the process group (joined once)
    parts: list = [None] * size
    dist.all_gather_object(parts, local)
    out: list = [None] * n
    for r, part in enumerate(parts):
        for i, value in zip(range(r, n, size), part):
            out[i] = value
    return out


def main_only() -> None:
    """From here on only rank 0 works: the others stop (they have recorded their shares, and waited for
    everyone's with `sync()`)."""
    if not is_main():
        raise Follower()


def close() -> None:
    """Leave the process group, if one was joined: a process that exits still holding a gloo group can abort in
    its teardown. (Rank 0 finishes the study alone, with no collective left, so no barrier is needed.)"""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
