import pytest
from typer.testing import CliRunner

from helpers import run_main

from lmlab.cli import _register_study_commands, app

runner = CliRunner()
_register_study_commands()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_unknown_model_is_one_line_and_exit_2():
    result = invoke("trace", "--model", "nope")
    assert result.exit_code == 2
    assert "unknown model 'nope'; embedded models: smollm2-135m, gemma3-270m, minilm-l6" in result.output
    assert "Traceback" not in result.output


def test_trace_on_a_tiny_model_writes_its_table(tmp_path):
    result = invoke("trace", "When Mary and John went to the store", "--model", "tiny-llama", "--span", "Mary",
                    "--target", " the", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "trace.csv").read_text().splitlines()
    assert lines[0].startswith("layer,p_clean,p_knockout,delta_pp") and len(lines) == 1 + 3


@pytest.mark.parametrize("args,message", [
    (("trace", "The capital", "--model", "tiny-llama", "--span", "Germany"), "does not occur in the prompt"),
    (("trace", "the " * 300, "--model", "tiny-llama", "--span", "the", "--target", " the"), "longer than"),
    (("trace", "The capital", "--model", "tiny-bert", "--span", "capital"), "not a causal language model"),
    (("bench", "--only", "nosuch"), "unknown benchmark 'nosuch'"),
    # optional list options (list[int] | None) are comma-separated too: the value reaches the study's check
    (("latent", "--rates", "3,16", "--out", "/tmp/lmlab-cli-test"), "rate 3 does not divide the chunk length 16"),
    (("quantize", "--model", "tiny-bert", "--budgets", "A,X", "--out", "/tmp/lmlab-cli-test"), "unknown budget 'X'"),
    # sizes of 0 or below are refused before any work, not replaced by the profile's default
    (("knockout", "--model", "tiny-llama", "--per-dataset", "-5", "--out", "/tmp/lmlab-cli-test"),
     "bad option --per-dataset: Input should be greater than or equal to 1"),
    (("knockout", "--model", "tiny-llama", "--per-dataset", "0", "--out", "/tmp/lmlab-cli-test"),
     "bad option --per-dataset"),
    (("latent", "--n-test", "0", "--out", "/tmp/lmlab-cli-test"), "bad option --n-test"),
])
def test_bad_input_is_a_sentence_not_a_traceback(args, message):
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_cli_tables_never_truncate_names_at_80_columns():
    import io

    from rich.console import Console

    from lmlab.cli import _table

    rows = [["smollm2-135m-instruct-extra-long-name", "llama", "a description long enough to need several lines "
             "with /a/very/long/path/that/cannot/fit/in/any/column/of/this/table", "ready"]]
    buf = io.StringIO()
    Console(file=buf, width=80).print(_table("models", ["name", "family", "source", "status"], rows, keep=("name",)))
    text = buf.getvalue()
    assert "…" not in text
    assert "smollm2-135m-instruct-extra-long-name" in text  # whole, on one line
    assert max(len(line) for line in text.splitlines()) <= 80
    folded = "".join(line.split("│")[3].strip() for line in text.splitlines() if line.count("│") >= 5)
    assert "/a/very/long/path/that/cannot/fit/in/any/column/of/this/table" in folded  # folded, not cut


def test_help_imports_neither_torch_nor_transformers():
    """`lmlab --help` registers every study from its config alone (the study code loads on first use)."""
    import subprocess
    import sys

    code = ("import sys\nfrom lmlab.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert "sparse-circuits" in out and "quantize" in out


@pytest.mark.parametrize("args,message", [
    (("knockout", "--profile", "huge"), "Invalid value for '--profile': 'huge' is not one of 'demo', 'quick', 'full'"),
    (("knockout", "--dtype", "int3"), "Invalid value for '--dtype': 'int3' is not one of 'auto', 'float32'"),
    (("knockout", "--per-dataset", "many"), "Invalid value for '--per-dataset'"),
    (("knockout", "--per-dataset", "0"), "bad option --per-dataset: Input should be greater than or equal to 1"),
    (("knockout", "--device", "tpu"), "bad option --device: 'tpu' is not a device; use auto"),
    (("knockout", "--no-such-option", "1"), "No such option: --no-such-option"),
    (("nosuch",), "No such command 'nosuch'"),
])
def test_every_bad_value_is_one_line_naming_the_option_and_exit_2(capsys, args, message):
    code, out, err = run_main(capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1, err


def test_help_shows_types_choices_defaults_and_a_sentence_per_option(capsys, monkeypatch):
    import re

    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_main(capsys, "knockout", "--help")
    assert code == 0
    text = re.sub(r"[│╭╮╰╯─]", " ", out)
    assert "<demo|quick|full>" in text and "<auto|float32|bfloat16|float16>" in text and "<each|span>" in text
    assert "demo 420, quick 600, full 1000" in text  # a profile size shows every profile's value
    assert "<int>" in text and "<float>" in text and "TEXT,..." in text
    assert "questions per dataset" in text and "FILE.yaml" in text
    code, out, _ = run_main(capsys, "sparse-circuits", "--help")
    assert "--mlps" in out and "--no-mlps" in out


def test_every_config_field_has_a_sentence_and_every_profile_key_is_a_field():
    from lmlab.studies import STUDIES
    from lmlab.studies.config import load_profiles

    for name, spec in STUDIES.items():
        fields = spec.config.model_fields
        missing = [f for f, info in fields.items() if not info.description]
        assert not missing, f"{name}: fields without a description: {missing}"
        profiles = load_profiles(spec.config.__module__.rpartition(".")[0])
        tables = [profiles["quick"], profiles["full"]] + [t for v in profiles.get("variants", {}).values()
                                                           for t in v.values()]
        stray = {k for t in tables for k in t} - set(fields)
        assert not stray, f"{name}: profiles.yaml keys that are no field: {stray}"
        config = spec.config(model=spec.default_model, device="cpu")  # a GPU takes a study's gpu variant
        for key in profiles["quick"]:  # a field left unset takes the profile's value
            assert config.size(key) == profiles["quick"][key]


def test_a_run_config_yaml_passed_back_gives_the_same_table(tmp_path, capsys):
    import yaml

    from lmlab.studies import load_result

    base = ("knockout", "--model", "tiny-llama", "--datasets", "geo-capital", "--per-dataset", "6",
            "--sweep-every", "2")
    code, _, err = run_main(capsys, *base, "--out", str(tmp_path / "a"))
    assert code == 0, err
    (first,) = (tmp_path / "a").glob("knockout-*")
    code, _, err = run_main(capsys, "knockout", "--config", str(first / "config.yaml"), "--out", str(tmp_path / "b"))
    assert code == 0, err
    (second,) = (tmp_path / "b").glob("knockout-*")
    assert (first / "config.yaml").read_text() == (second / "config.yaml").read_text()
    a, b = load_result(first), load_result(second)
    assert set(a.tables) == set(b.tables)
    for kind in a.tables:
        assert a.tables[kind].equals(b.tables[kind]), kind
    # an option on the command line wins over the file
    code, _, err = run_main(capsys, "knockout", "--config", str(first / "config.yaml"), "--per-dataset", "4",
                            "--out", str(tmp_path / "c"))
    assert code == 0, err
    (third,) = (tmp_path / "c").glob("knockout-*")
    settings = yaml.safe_load((third / "config.yaml").read_text())
    assert settings["per_dataset"] == 4 and settings["datasets"] == ["geo-capital"] and settings["sweep_every"] == 2


def test_a_bad_config_file_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny-llama\nper_datset: 3\n")
    code, _, err = run_main(capsys, "knockout", "--config", str(bad), "--out", str(tmp_path / "runs"))
    assert code == 2 and "unknown key 'per_datset' for knockout" in err and len(err.strip().splitlines()) == 1
    bad.write_text("model: tiny-llama\nper_dataset: 0\n")
    code, _, err = run_main(capsys, "knockout", "--config", str(bad), "--out", str(tmp_path / "runs"))
    assert code == 2 and "key 'per_dataset': Input should be greater than or equal to 1" in err
    bad.write_text("- just\n- a list\n")
    code, _, err = run_main(capsys, "knockout", "--config", str(bad))
    assert code == 2 and "expected a mapping" in err
    code, _, err = run_main(capsys, "knockout", "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read the config file" in err
    assert not (tmp_path / "runs").exists()


def test_inputs_that_need_no_model_fail_before_torch_loads(tmp_path):
    """Each error class of the bad-input benchmark: one sentence, exit 2, and neither torch nor transformers
    imported (the benchmark times them; this checks what they say and what they load)."""
    import importlib.util
    import subprocess
    import sys

    from lmlab.benchmarks.inputs import bad_inputs, with_out

    expected = {"missing data file": "no popqa file", "a line that is not JSON": "bad.jsonl:2: not valid JSON",
                "a malformed GSM8K row": "bad.jsonl:1: a GSM8K row needs", "--bits 3": "3-bit weights are not supported",
                "--rates 0": "rate 0 does not divide", "unknown task": "unknown circuit task 'nope'",
                "a folder that is not a model": "is not a model directory (no config.json)",
                "no such model path": "no such file or directory", "unknown model name": "unknown model 'no-such-model'",
                "a model folder without weights": "has a config.json but no weights",
                "a .gguf that is not GGUF": "is not a GGUF file (it does not start with the GGUF magic bytes)",
                "--max-memory not a size": "--max-memory: 'cpu=lots' is not a size",
                "--offload on a file": "bad.jsonl: a file is there, not a folder",
                "--jobs below 1": ("Invalid value for '--jobs': Input should be greater than or equal to 1",  # typer 0.29
                                   "Invalid value for '--jobs': -1 is not in the range x>=1"),  # older typer (click's)
                "--out that cannot be made": "bad.jsonl is a file, so the folder cannot be made",
                "reproduce --out that cannot be made": "bad.jsonl is a file, so the folder cannot be made",
                "unknown tracker": "unknown tracker 'tensorbored' for --log-with",
                "export of a folder that is not a quantize run": "is not a quantize run folder",
                "a model folder with damaged weights": "model.safetensors is damaged: it holds 79 bytes but its "
                                                       "tensors need 111",
                "trace of an empty prompt": "the prompt is empty",
                "trace of a span not in the prompt": "--span 'France' does not occur in the prompt",
                "lm-eval of a model that is not there": ("no hub reachable" if importlib.util.find_spec("lm_eval")
                                                         else "pip install 'lmlab[lmeval]'")}
    probe = ("import sys\nfrom lmlab.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
             "    print('EXIT', e.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    cases = bad_inputs(tmp_path)
    assert {c for c, _ in cases} == set(expected)
    for case, args in cases:
        done = subprocess.run([sys.executable, "-c", probe, *with_out(args, tmp_path)], capture_output=True, text=True)
        assert done.stdout.strip().splitlines()[-1] == "EXIT 2 False False", (case, done.stdout, done.stderr)
        lines = [l for l in done.stderr.splitlines() if l.strip()]
        said = expected[case] if isinstance(expected[case], tuple) else (expected[case],)
        assert len(lines) == 1 and lines[0].startswith("error:") and any(e in lines[0] for e in said), (case, lines)
    assert not (tmp_path / "runs").exists()


def test_the_study_config_knows_the_quantizers_bit_widths():
    from lmlab.interventions.quant import BITS
    from lmlab.studies.quantize.config import BITS as CONFIG_BITS

    assert CONFIG_BITS == BITS


def test_peers_benchmark_without_the_extra_says_how_to_install_it(monkeypatch, capsys):
    """Without TransformerLens and nnsight the peers benchmark loads no model and prints one line."""
    import sys

    from lmlab.benchmarks.peers import peers_bench

    monkeypatch.setitem(sys.modules, "nnsight", None)  # an import of it raises ImportError
    rows = peers_bench()
    assert capsys.readouterr().out.strip() == "the peers benchmark needs TransformerLens and nnsight: " \
                                              "pip install 'lmlab[peers]'"
    assert len(rows) == 1 and rows[0]["value"] is None


def test_bench_help_names_every_benchmark_that_only_takes(capsys):
    """`lmlab bench --help` lists the benchmarks from a catalog read without torch: it names exactly the registered
    ones."""
    from lmlab.benchmarks import CATALOG, load_all

    assert set(CATALOG) == set(load_all())
    code, out, _ = run_main(capsys, "bench", "--help")
    shown = " ".join(out.split())
    assert code == 0
    assert all(f"{name}:" in shown for name in CATALOG)


def test_a_cpu_with_bf16_hardware_is_told_once_that_bf16_is_faster(monkeypatch, capsys):
    """The note is printed where it helps (dtype auto on a CPU with AMX or AVX512-BF16) and nowhere else: not when
    a dtype is chosen, not on a CPU that would emulate bf16."""
    from lmlab import cli, environment

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # (a cap below AMX silences it: checked at the end)
    said = {}
    for kinds in ([], ["AVX512-BF16"], ["AMX", "AVX512-BF16"]):
        monkeypatch.setattr(environment, "bf16_hardware", lambda kinds=kinds: kinds)
        for dtype in ("auto", "float32", "bfloat16"):
            cli._bf16_note(dtype, "cpu")
            said[(tuple(kinds), dtype)] = capsys.readouterr().err
    noted = {key for key, text in said.items() if text}
    assert noted == {(("AVX512-BF16",), "auto"), (("AMX", "AVX512-BF16"), "auto")}, said
    assert "(AVX512-BF16)" in said[(("AVX512-BF16",), "auto")]
    text = said[(("AMX", "AVX512-BF16"), "auto")]
    assert text.startswith("note:") and "--dtype bfloat16" in text and len(text.strip().splitlines()) == 1
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    cli._bf16_note("auto", "cpu")
    assert capsys.readouterr().err == ""


def test_claims_without_a_study_lists_what_the_registry_holds():
    from lmlab.studies import STUDIES

    result = invoke("claims")
    assert result.exit_code == 0
    for name, spec in STUDIES.items():
        assert name in result.output
    compare = next(line for line in result.output.splitlines() if line.startswith("│ compare"))
    assert compare.split("│")[3].strip() == "0"  # no paper's claim: compare's are lmlab's alone
