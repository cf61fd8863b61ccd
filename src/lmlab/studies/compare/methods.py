"""compare's ways of making a variant in the run (`--make METHOD:BITS`): one entry per method, from which the option's
help, its refusals, the checks of its package and the run's jobs come. `parse_make` reads the option once into a
`Made`; a variant made in the run carries its method and width from there (recipe.Variant), never read back from
its name.

Adding a method: an entry in METHODS (its widths, what it makes, its grid as the made folder's recipe says it, the
package it needs) and its quantizer in `lmlab.interventions.quant.round_to_nearest` (a post-training method that
rounds weight by weight), its own function under `lmlab.interventions` called from the recipe's `_quantized`
(`calibrated`: a post-training method that reads the layers' inputs on calibration text, as gptq and awq do), or
its own maker in the recipe (`trains`: students of lmlab quantize)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lmlab.errors import LmlabError

SPARSE = "sparse"  # --make sparse: S4's model half through the registry, its sparse models the variants


@dataclass(frozen=True)
class Method:
    name: str
    widths: tuple[int, ...]  # the bit widths it can make, widest first
    what: str  # what it makes, for --make's help
    grid: str = ""  # a post-training method: how the weights are rounded (written into the made folder's recipe)
    trains: bool = False  # students trained by lmlab quantize (one run folder), not a copy of the original
    needs: str = ""  # the extra package it needs ("hqq", "bnb", "torchao", "autoround"), checked before any work
    calibrated: bool = False  # quantizes from the layers' inputs on calibration text (gptq, awq), not weight by weight

    @property
    def example(self) -> str:
        return f"{self.name}:{self.widths[0]},{self.widths[-1]}"


METHODS = {m.name: m for m in (
    Method("quantized", (8, 4, 2, 1), "students trained by lmlab quantize's recipe (its decoder option at this "
           "profile's sizes; --seeds replicates each)", trains=True),
    Method("rtn", (8, 7, 6, 5, 4, 3, 2), "the original rounded to nearest, each row of every linear layer on its own "
           "grid, no training: the post-training baseline",
           grid="asymmetric, one per row of each linear layer (min to max, zero included), as GPTQ's round-to-nearest "
                "baseline"),
    Method("hqq", (8, 4, 3, 2, 1), "the original quantized by Half-Quadratic Quantization, groups of 64 weights (the "
           "hqq extra)",
           grid="Half-Quadratic Quantization (the hqq package's quantizer with its settings for the width): groups of "
                "64 weights along the input, a scale and a zero point each, the zero points optimized; stored "
                "de-quantized", needs="hqq"),
    Method("bnb", (8, 4), "bitsandbytes' quantizers: NF4 in blocks of 64 at 4 bits, LLM.int8()'s int8 rows at 8 (the "
           "bnb extra)",
           grid="bitsandbytes' own quantizers: at 4 bits NF4 (blocks of 64 consecutive weights, each scaled by its "
                "absmax onto the 16 NormalFloat levels), at 8 bits LLM.int8()'s weights (each row in int8 on its "
                "absmax; its activation rounding at inference not applied); stored de-quantized", needs="bnb"),
    Method("torchao", (8, 4), "torchao's weight-only quantizers: int8 rows at 8 bits, int4 in groups of 128 at 4 (the "
           "torchao extra)",
           grid="torchao's own quantize_ (weight-only): at 8 bits Int8WeightOnlyConfig, each row in int8, symmetric on "
                "its absmax; at 4 bits IntxWeightOnlyConfig at int4, symmetric, in groups of 128 weights along the "
                "input (64 or 32 where 128 does not divide the input; the CPU's int4 path); stored de-quantized",
           needs="torchao"),
    Method("gptq", (8, 4, 3, 2), "the original quantized by GPTQ (lmlab's implementation): each layer's rounding error "
           "spread over its inputs not yet rounded through the Hessian of its inputs on calibration text, groups of "
           "128",
           grid="GPTQ (Frantar et al. 2022), lmlab's implementation: asymmetric, one grid per output row in groups of "
                "128 input columns (min to max, zero included); columns in order, the Hessian 2X^TX / n dampened by 1% "
                "of its mean diagonal; block after block and, within a block, layer after layer on the outputs of the "
                "layers already quantized; stored de-quantized", calibrated=True),
    Method("awq", (8, 4, 3, 2), "the original quantized by AWQ through AutoRound: per-channel scales searched on "
           "calibration text folded into the operation before each layer, then rounded in groups of 128 (the "
           "autoround extra)",
           grid="AWQ (Lin et al. 2023) through AutoRound's AWQConfig: per-channel scales s = mean|x|^a / "
                "mean|w|^(1-a) (19 values of a from 0 to 1) or s = 1, the one that gives the least output error of the "
                "layers' parent on the calibration text kept and folded into the preceding norm or projection; then "
                "AutoRound's RTN, asymmetric, one grid per output row in groups of 128 input columns; stored "
                "de-quantized", needs="autoround", calibrated=True),
)}

# methods a user may ask for that lmlab cannot make in its own environment: name -> why (each is then made with
# llm-compressor in an environment of its own and compared as --variant DIR); none at present
NOT_MADE: dict[str, str] = {}

# a variant at one bit width of a method made elsewhere: a folder so named (`.../gptq-4bit`); the method is its name
# without the width (read once, where the variant is expanded)
WIDTH = r"(?:.*[/\\])?([^/\\]+)-(\d+)bit[/\\]?"


def make_help() -> str:
    """--make's help, from METHODS."""
    made = "; ".join(f"{m.example} ({m.what}; widths {', '.join(map(str, m.widths))})" for m in METHODS.values())
    return (f"variants made in the run: {made}; each post-training variant saved as a model folder with its recipe "
            f"and its perplexity on held-out text; {SPARSE} (lmlab sparse-circuits' model half at this profile's "
            f"--circuits sizes, without its toy: the original post-trained with sparse attention, --seeds "
            "replicates)" + (f". {', '.join(n.upper() for n in NOT_MADE)} are made with llm-compressor in an "
                             "environment of its own and compared as --variant DIR" if NOT_MADE else ""))


@dataclass(frozen=True)
class Made:
    """--make, read: the widths asked of each method (in the order given, each once) and whether S4's sparse models
    are made."""

    widths: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sparse: bool = False

    def bits(self, method: str) -> tuple[int, ...]:
        return self.widths.get(method, ())

    def post_training(self) -> list[tuple[Method, int]]:
        """The variants made from the original without training: (method, bits), in METHODS' order."""
        return [(m, b) for m in METHODS.values() if not m.trains for b in self.bits(m.name)]

    def needs(self) -> list[str]:
        """The extra packages the methods asked for need."""
        return [METHODS[name].needs for name in self.widths if METHODS[name].needs]


def parse_make(items: list[str]) -> Made:
    """--make's values read once; one sentence for a method lmlab cannot make here, an unknown one or a width the
    method does not have."""
    widths: dict[str, list[int]] = {}
    for item in items:
        if item == SPARSE:
            continue
        name, _, rest = item.partition(":")
        if name in NOT_MADE:
            raise LmlabError(f"--make {item}: lmlab cannot make {name.upper()} variants here: {NOT_MADE[name]}; make "
                             "the checkpoint with llm-compressor in an environment of its own and pass its folder as "
                             "--variant DIR (it is read de-quantized)")
        if name not in METHODS:
            raise LmlabError(f"--make {item}: unknown method '{name}'; use "
                             + ", ".join(f"{m.name}:BITS (e.g. {m.example})" for m in METHODS.values())
                             + f" or {SPARSE} (lmlab sparse-circuits' sparse-attention models)")
        allowed = METHODS[name].widths
        given = [b.strip() for b in rest.split(",") if b.strip()]
        parts = [int(b) for b in given] if all(b.isdigit() for b in given) else []
        if not parts or any(b not in allowed for b in parts):
            raise LmlabError(f"--make {item}: give the bits, each one of {', '.join(map(str, allowed))} (e.g. "
                             f"{METHODS[name].example})")
        widths.setdefault(name, [])
        widths[name] += [b for b in parts if b not in widths[name]]
    return Made({k: tuple(v) for k, v in widths.items()}, SPARSE in items)


def _check_hqq() -> None:
    import importlib.util

    from lmlab.extras import HQQ

    if importlib.util.find_spec("hqq") is None:
        raise LmlabError(HQQ)


def _check_bnb() -> None:
    from lmlab.models.quantized import bnb_functional

    bnb_functional()  # (one sentence where the bnb extra is missing)


def _check_torchao() -> None:
    from lmlab.interventions.quant import torchao_api

    torchao_api()  # (one sentence where the torchao extra is missing)


def _check_autoround() -> None:
    from lmlab.interventions.awq import check_autoround

    check_autoround()


# each extra a method may need (`Method.needs`), and the check that says in one sentence it is missing
EXTRA_CHECKS = {"hqq": _check_hqq, "bnb": _check_bnb, "torchao": _check_torchao, "autoround": _check_autoround}


def check_packages(made: Made) -> None:
    """One sentence where a method's extra package is missing (before any work)."""
    for package in made.needs():
        EXTRA_CHECKS[package]()


def width_of_name(name: str) -> tuple[str, int] | None:
    """(method, bits) of a variant folder named at a width (`gptq-4bit`), else None."""
    found = re.fullmatch(WIDTH, name)
    return (found.group(1), int(found.group(2))) if found else None
