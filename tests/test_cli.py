import pytest
from typer.testing import CliRunner

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
