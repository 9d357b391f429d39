"""PNG figures of evaluation results: attention alignments and labelled curves.

Every function returns the matplotlib Figure and, given a path, writes the PNG atomically.
The non-interactive Agg backend is used, so no display is needed.
"""

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from zoo.io import atomic_write_bytes  # noqa: E402


LINES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x")


def save_png(figure, path, dpi: int = 120) -> Path:
    """Write `figure` as a PNG, atomically, and close it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


def plot_alignment(attention, source_tokens: list[str], target_tokens: list[str], path=None,
                   title: str | None = None):
    """Heat map of attention weights: one row per target token, one column per source token.

    Args:
        attention: `(target, source)` weights (tensor, array or nested lists); rows sum to 1.
        source_tokens: column labels, `len == source`.
        target_tokens: row labels, `len == target`.
        path: where to write the PNG (optional).
        title: figure title, e.g. the source sentence.

    Returns:
        The matplotlib Figure (closed when written to `path`).
    """
    weights = np.asarray(attention.tolist() if hasattr(attention, "tolist") else attention, dtype=float)
    if weights.ndim != 2 or weights.shape != (len(target_tokens), len(source_tokens)):
        raise ValueError(
            f"attention of shape {weights.shape} does not match {len(target_tokens)} target x "
            f"{len(source_tokens)} source tokens; pass one label per row and per column"
        )
    rows, columns = weights.shape
    figure, axes = plt.subplots(figsize=(max(4.0, 0.45 * columns + 2), max(3.0, 0.4 * rows + 1.5)))
    image = axes.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(columns), source_tokens, rotation=60, ha="right", fontsize=8)
    axes.set_yticks(range(rows), target_tokens, fontsize=8)
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="attention weight")
    if path is not None:
        save_png(figure, path)
    return figure


def plot_curves(curves: list[dict], path=None, title: str = "", xlabel: str = "", ylabel: str = "",
                logx: bool = False, logy: bool = False, reference: dict | None = None, categorical: bool = False):
    """Line plot of labelled curves.

    Args:
        curves: `[{"label": str, "x": [...], "y": [...], "style": optional matplotlib format}]`;
            None values in y are skipped.
        reference: an optional extra curve drawn dotted in black (a formula, chance), same keys.
        categorical: x values are labels (e.g. length buckets), drawn evenly spaced.

    Returns:
        The matplotlib Figure (closed when written to `path`).
    """
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for index, curve in enumerate([*curves, *([reference] if reference else [])]):
        points = [(x, y) for x, y in zip(curve["x"], curve["y"]) if y is not None]
        if not points:
            continue
        xs, ys = zip(*points)
        if categorical:
            labels = list(curve["x"])
            xs = [labels.index(x) for x in xs]
            axes.set_xticks(range(len(labels)), labels)
        # Distinct dashes and markers, so curves that coincide stay visible.
        default = LINES[index % len(LINES)] + (MARKERS[index % len(MARKERS)] if len(xs) <= 12 else "")
        style = "k:" if curve is reference else curve.get("style", default)
        axes.plot(xs, ys, style, label=curve["label"], markersize=4, linewidth=1.4)
    if logx:
        axes.set_xscale("log", base=2)
    if logy:
        axes.set_yscale("log")
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    if path is not None:
        save_png(figure, path)
    return figure
