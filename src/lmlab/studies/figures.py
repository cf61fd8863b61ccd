"""A study's figure: its canvas (a new figure or one model's panel row), its caption and its layout."""

from __future__ import annotations


def canvas(fig, size: tuple[float, float], *grid, **kwargs):
    """(figure, axes) for a study's figure: a new Figure of `size`, or the SubFigure the caller gave (one
    model's panel row in a several-model figure). `grid` and `kwargs` go to `subplots`."""
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=size)
    return fig, fig.subplots(*grid, **kwargs)


def caption(fig, text: str) -> None:
    """Name the figure's model(s) and data in its title: a figure a reader can cite (a SubFigure of a several-model
    figure is titled by its model instead, by the runner)."""
    if hasattr(fig, "tight_layout"):
        old = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
        fig.suptitle(text + (f"\n{old}" if old else ""), fontsize=10)


def finish(fig):
    """Tight layout on a whole figure (a SubFigure takes its parent's layout)."""
    if hasattr(fig, "tight_layout"):
        fig.tight_layout()
    return fig
