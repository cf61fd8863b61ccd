"""The latent study's latent model (r = the run's largest rate) vs CoT at inference, wall time and tokens per
problem.

The two fine-tuned models of one finished `lmlab latent` run (given with `--latent-run DIR`; without it
the quick from-scratch study is run at one replicate, or reused, under the bench folder) generate greedily on the same
test problems, alternating over several rounds in one process; the ratio is latent time over CoT time
(< 1: latent is faster) next to the ratio of generated tokens.

latent-codes: the chain codes of the quick profile's training problems (what each replicate encodes before its
latent model trains), one problem a call against all their segments in batches, on the device, with an untrained
VQ-VAE of the profile's shape; the share of codes on which the two agree (near ties of two codes may differ).
"""

from __future__ import annotations

import time
from pathlib import Path


from lmlab.benchmarks.registry import benchmark
from lmlab.errors import LmlabError


@benchmark("latent-vs-cot")
def latent_bench(latent_run: str | None = None, out_dir: str | Path = "runs/bench", rounds: int = 3,
                 **_) -> list[dict]:
    from lmlab.studies import latent as study
    from lmlab.studies import run_study
    from lmlab.studies.latent.measure import evaluate
    from lmlab.studies.result import read_config

    if latent_run is None:
        # one replicate: the bench reads replicate 0 only
        latent_run = run_study(study.SPEC, study.Config(model="scratch", profile="quick", seeds=1),
                               Path(out_dir) / "latent-study").path
    run = Path(latent_run)
    config = read_config(run, study.SPEC)
    prep = study.prepare(config)
    rate = max(config.size("rates"))
    weights = {name: study.final_weights(run, name) for name in ("cot", f"r{rate}")}  # replicate 0
    model = prep.initial[0]
    model.eval()
    times = {name: 0.0 for name in weights}
    tokens = {}
    for _ in range(rounds):
        for name, state in weights.items():
            missing, unexpected = model.load_state_dict(state, strict=False)  # a tied head is stored once
            if unexpected or set(missing) - {"lm_head.weight"}:
                raise LmlabError(f"the {name} checkpoint in {run} does not fit the rebuilt model "
                                 f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
            t0 = time.perf_counter()
            result = evaluate(model, prep.vocab, prep.test, max_new=prep.max_new)[0]
            times[name] += time.perf_counter() - t0
            tokens[name] = sum(result["tokens"]) / len(result["tokens"])
    n = len(prep.test)
    setup = (f"{config.model} (replicate 0), {n} test problems, greedy, batch 250, {rounds} alternating rounds, "
             f"run {run.name}")
    base_t = times["cot"]
    rows = []
    for name in weights:
        label = "CoT" if name == "cot" else f"latent r={rate}"
        rows.append(dict(benchmark="latent-vs-cot", case=f"{label}: wall time per problem",
                         value=round(1000 * times[name] / (rounds * n), 2), unit="ms", ratio=round(times[name] / base_t, 3),
                         target=None, note="time ratio vs CoT; < 1 is faster" if name != "cot" else None, setup=setup))
        rows.append(dict(benchmark="latent-vs-cot", case=f"{label}: generated tokens per problem",
                         value=round(tokens[name], 2), unit="tokens", ratio=round(tokens[name] / tokens["cot"], 3),
                         target=None, setup=setup))
    return rows


@benchmark("latent-codes")
def latent_codes_bench(device: str = "cpu", n_problems: int = 3000, repeats: int = 3, **_) -> list[dict]:
    import torch

    from lmlab.benchmarks.registry import alternate, drain
    from lmlab.studies import latent as study
    from lmlab.studies.latent.measure import build_vq, chunk_codes, chunk_codes_many

    config = study.Config(model="scratch", profile="quick", n_train=n_problems, seeds=1, device=device)
    prep = study.prepare(config)
    torch.manual_seed(0)
    vq = build_vq(prep.vocab, prep.train, config, max(config.size("rates")), device=device).eval()
    torch.nn.init.normal_(vq.quantizer.codebook.weight)

    def each():
        out = [chunk_codes(vq, prep.vocab, ex, config.chunk) for ex in prep.train]
        drain(device)
        return out

    def batched():
        out = chunk_codes_many(vq, prep.vocab, prep.train, config.chunk)
        drain(device)
        return out

    times, results = alternate({"one problem a call": each, "batches of 1024 segments": batched}, repeats)
    one, many = results["one problem a call"], results["batches of 1024 segments"]
    same = sum(a == b for x, y in zip(one, many) for a, b in zip(x, y))
    total = sum(len(x) for x in one)
    setup = (f"{len(prep.train)} training problems of the latent study's quick profile, r = {vq.rate}, untrained "
             f"VQ-VAE, {device}, best of {repeats} alternating; codes that agree: {same} of {total}")
    base = times["one problem a call"]
    return [dict(benchmark="latent-codes", case=f"S0 chain codes: {name}", value=round(t, 3), unit="s",
                 ratio=round(t / base, 3), target=None, setup=setup) for name, t in times.items()]
