"""S2 packed checkpoint sizes, measured on disk: the quantized matrices packed vs the same matrices in fp32.

Two safetensors files are written for each bit width, one with the packed codes and scales of every
quantized matrix, one with those matrices in fp32, and their sizes on disk are compared (XTC: 32x).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from lmlab.benchmarks import benchmark
from lmlab.interventions.quant import quant_targets, quantize_model, save_packed
from lmlab.models import load_model


@benchmark("packed-size")
def packed_size_bench(**_) -> list[dict]:
    name = "minilm-l6"  # always the encoder study's model, whatever `lmlab bench --model` names
    lm = load_model(name, head="classifier", num_labels=2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for bits, target in ((1, 1 / 28), (2, 1 / 14)):
            student = copy.deepcopy(lm.model)
            quantize_model(student, bits)
            full = Path(tmp) / f"packed-{bits}.safetensors"
            save_packed(student, full)
            tensors = load_file(str(full))
            packed = {k: v for k, v in tensors.items() if not k.startswith("rest.")}
            save_file(packed, str(Path(tmp) / f"q-{bits}.safetensors"))
            fp32 = {n: m.weight.detach().contiguous() for n, (m, _) in quant_targets(student).items()}
            save_file(fp32, str(Path(tmp) / f"f-{bits}.safetensors"))
            q_size = (Path(tmp) / f"q-{bits}.safetensors").stat().st_size
            f_size = (Path(tmp) / f"f-{bits}.safetensors").stat().st_size
            rows.append(dict(benchmark="packed-size", case=f"{bits}-bit packed vs fp32 (quantized matrices)",
                             value=round(q_size / 2**20, 2), unit="MiB on disk", ratio=round(q_size / f_size, 4),
                             target=round(target, 4), setup=f"{name}: {round(f_size / 2**20, 1)} MiB in fp32; "
                                                             f"whole packed checkpoint {round(full.stat().st_size / 2**20, 1)} MiB"))
    return rows
