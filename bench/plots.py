"""What the benches draw their figures with: matplotlib off screen, bars labelled with their
values, the rounds behind a median as dots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot, drawing off screen (Agg): imported only when a bench plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label_bars(
    ax: Any, bars: Any, values: Sequence[float], small: str = ",.2f", **style: Any
) -> None:
    """Each bar's value above it (``small`` the format of values under 100)."""
    for b, v in zip(bars, values, strict=True):
        ax.annotate(
            f"{v:{small}}" if v < 100 else f"{v:,.0f}",
            (b.get_x() + b.get_width() / 2, v),
            ha="center",
            va="bottom",
            **style,
        )


def dot_rounds(ax: Any, rounds: Sequence[Sequence[float]], size: int = 10) -> None:
    """Each bar's rounds as dots over it (bar ``i`` has ``rounds[i]``)."""
    for i, values in enumerate(rounds):
        ax.scatter([i] * len(values), values, color="black", s=size, zorder=3)


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay ``fig`` out, write it to ``path`` and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
