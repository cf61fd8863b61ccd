"""Greedy decoding: lmlab's loop (the knockout study's answers, the filler study's solutions) vs `transformers`'
`generate`, side by side.

The same prompts (the knockout study's few-shot geo-capital questions; the filler study's chat prompts on generated
arithmetic problems, 55 filler tokens inserted), the same number of new tokens for every row (neither stops at
an end-of-sequence token, so both do the same work), at batch 1 and at the study's batch; the cases alternate,
the best of the repeats is kept, and the share of generated tokens on which the two agree is printed (greedy on
the same model: float order may split a near-tie). The bound: decoding reads every weight once a step, so at
batch 1 no loop beats (memory bandwidth / weight bytes) tokens a second; the bandwidth is measured here (a sum
over a 1 GiB tensor on the device), and the share of the bound printed (at batch b the bound is b times that).

`--device cuda`: the model in bf16 on the GPU, both loops at batch 1, the study's batch (the filler study's quick
profile generates thousands of problems there in batches of 1024) and GPU_BATCH, the GPU's queue drained before each
clock reading.
"""

from __future__ import annotations

from lmlab.benchmarks.registry import alternate, benchmark, drain


GPU_BATCH = 128  # the large batch a GPU run adds


def _synced(fn, device: str):
    """`fn`, returning only once the device has finished its work."""
    def run():
        out = fn()
        drain(device)
        return out
    return run


def _bandwidth(device: str = "cpu") -> float:
    """Bytes a second read by a sum over a 1 GiB float32 tensor on `device` (best of 5)."""
    import torch

    x = torch.ones(2 ** 28, device=device)
    x.sum()
    best = alternate({"sum": _synced(x.sum, device)}, 5)[0]["sum"]
    del x
    return 2 ** 30 / best


def _prompts(lm, which: str, n: int) -> list[list[int]]:
    if which == "S1":
        from lmlab.data.generated.geo_qa import generate
        from lmlab.studies.knockout.measure import encode_item

        return [e["ids"] for e in (encode_item(lm, item) for item in generate("geo-capital", 2 * n, seed=0))
                if e is not None][:n]
    from lmlab.data.math import generate_arithmetic
    from lmlab.studies.filler.measure import build_ids

    return [build_ids(lm, item.question, ".", 55)[0] for item in generate_arithmetic(n, 0)][:n]


def _hf_generate(lm, plain, prompts: list, batch: int, new: int, pad: int) -> list[list[int]]:
    """Transformers' own greedy `generate` on `plain` (sdpa attention), `new` tokens a prompt in batches."""
    import torch

    out_ids: list = []
    for start in range(0, len(prompts), batch):
        enc = lm.pad_batch(prompts[start:start + batch])  # (on the model's device)
        enc.pop("position_ids", None)  # generate derives them from the mask
        with torch.no_grad():
            out = plain.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=pad,
                                 eos_token_id=None)
        out_ids.extend(out[:, enc["input_ids"].shape[1]:].tolist())
    return out_ids


def _generation_jobs(model: str, gpu: bool) -> list[tuple[str, int, int]]:
    """(study, its batch, new tokens a prompt) of the studies that generate: S1 at its defaults, S3 at its quick
    profile's batch with 64 new tokens (1024 on a GPU in the study itself)."""
    from lmlab.studies.filler.config import Config as S3Config
    from lmlab.studies.knockout.config import Config as S1Config

    return [("S1", S1Config.model_fields["batch_size"].default, S1Config.model_fields["max_new_tokens"].default),
            ("S3", S3Config(model=model, device="cuda" if gpu else "cpu", profile="quick").size("batch_size"), 64)]


@benchmark("generation")
def generation_bench(model: str = "smollm2-135m", repeats: int = 2, device: str = "cpu", **_) -> list[dict]:
    import torch

    from lmlab.generation import _generate
    from lmlab.models import load_model
    gpu = device.startswith("cuda")
    dtype = torch.bfloat16 if gpu else None
    lm = load_model(model, dtype=dtype, device=device)
    plain = load_model(model, dtype=dtype, device=device).model  # generate on a model of its own: sdpa attention
    plain.set_attn_implementation("sdpa")
    weight_bytes = sum(p.numel() * p.element_size() for p in plain.parameters())
    bound = _bandwidth(device) / weight_bytes  # steps a second when every step reads every weight once
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    rows = []
    for study, study_batch, new in _generation_jobs(model, gpu):
        for batch in sorted({1, study_batch} | ({GPU_BATCH} if gpu else set())):
            prompts = _prompts(lm, study, max(batch, 4) if batch == 1 else batch)
            ours_out: list = []
            hf_out: list = []

            def ours():
                ours_out[:] = _generate(lm, prompts, new, set(), True, batch)

            def hf():
                hf_out[:] = _hf_generate(lm, plain, prompts, batch, new, pad)
            times, _ = alternate({"lmlab": _synced(ours, device), "generate": _synced(hf, device)}, repeats)
            tokens = len(prompts) * new
            same = sum(a == b for x, y in zip(ours_out, hf_out) for a, b in zip(x, y)) / tokens
            rate = {k: tokens / t for k, t in times.items()}
            setup = (f"{model}, {study} prompts (~{sum(map(len, prompts)) // len(prompts)} tokens), {len(prompts)} "
                     f"prompts x {new} new tokens, batch {batch}, best of {repeats}; tokens agreeing {same:.1%}; "
                     f"bandwidth bound at batch {batch}: {bound * batch:.0f} tokens/s; on {device}"
                     + (" (bf16)" if gpu else ""))
            for name in ("generate", "lmlab"):
                rows.append(dict(benchmark="generation", case=f"{study}, batch {batch}: {name}",
                                 value=round(rate[name], 1), unit="tokens/s",
                                 ratio=round(rate[name] / rate["generate"], 2), target=None,
                                 note=(f"aim >= 1x; {rate[name] / (bound * batch):.0%} of the bandwidth bound"
                                       if name == "lmlab" else None), setup=setup))
    return rows


@benchmark("generation-cache")
def generation_cache_bench(model: str = "smollm2-135m", repeats: int = 2, device: str = "cpu", new: int = 128,
                           **_) -> list[dict]:
    """lmlab's loop as it runs (the cache written in place, finished rows waiting until they are an eighth of the
    batch) against the same loop with transformers' growing cache layer (a copy of the whole cache each step) and
    finished rows leaving at once: the filler study's prompts, greedy, stopping at the model's stop tokens, at
    that study's batch (64 on a CPU, 1024 on a GPU). The answers must be identical."""
    import torch

    from lmlab import generation
    from lmlab.models import load_model
    from lmlab.studies.filler.config import Config as S3Config

    gpu = device.startswith("cuda")
    lm = load_model(model, dtype=torch.bfloat16 if gpu else None, device=device)
    batch = S3Config(model=model, device="cuda" if gpu else "cpu", profile="quick").size("batch_size")
    prompts = _prompts(lm, "S3", batch)
    stop = generation.stop_tokens(lm)

    def run(in_place: bool):
        saved = generation.IN_PLACE, generation.LEAVE_AT
        generation.IN_PLACE, generation.LEAVE_AT = (True, saved[1]) if in_place else (False, len(prompts) + 1)
        try:
            return generation._generate(lm, prompts, new, stop, True, batch)
        finally:
            generation.IN_PLACE, generation.LEAVE_AT = saved

    times, outs = alternate({"in place": _synced(lambda: run(True), device),
                             "copying": _synced(lambda: run(False), device)}, repeats)
    tokens = sum(len(o) for o in outs["in place"])
    same = sum(a == b for a, b in zip(outs["in place"], outs["copying"]))
    setup = (f"{model}, filler prompts, {len(prompts)} prompts, greedy up to {new} new tokens ({tokens} generated), "
             f"batch {batch}, best of {repeats}; answers identical: {same} of {len(prompts)}; on {device}"
             + (" (bf16)" if gpu else ""))
    return [dict(benchmark="generation-cache", case=f"S3, batch {batch}: {name}", value=round(tokens / times[name], 1),
                 unit="tokens/s", ratio=round(times["copying"] / times[name], 2), target=None,
                 note="aim > 1x" if name == "in place" else None, setup=setup) for name in ("copying", "in place")]
