"""examples/knockout.ipynb runs from top to bottom (at fewer questions), so the example cannot rot."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "knockout.ipynb"


@pytest.mark.embedded
def test_the_example_notebook_runs_and_shows_the_verdict_and_the_figure(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat, nbclient and ipykernel")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient and ipykernel")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    sizes = nb.cells[1]
    assert "QUESTIONS = 192" in sizes.source and 'OUT = "runs"' in sizes.source
    sizes.source = sizes.source.replace("QUESTIONS = 192", "QUESTIONS = 24").replace(
        'OUT = "runs"', f"OUT = {str(tmp_path / 'runs')!r}")
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = nb.cells[2].outputs[-1]["data"]
    html = shown["text/html"]
    assert any(status in html for status in ("reproduced", "inconclusive")) and "<img" in html  # verdict, figure
    assert "text/html" in nb.cells[3].outputs[-1]["data"]  # the Verdict renders alone too
    assert str(tmp_path / "runs") in nb.cells[4].outputs[-1]["data"]["text/plain"]
    assert "correct" in nb.cells[5].outputs[-1]["data"]["text/plain"]  # one row per question
