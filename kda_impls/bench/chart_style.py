"""How the charts of :mod:`kda_impls.bench.plots` look: colours, titles, legends and axes.

A library keeps one colour (and marker) in every chart of every run; in a chart of one library's
variants each variant gets a colour of its own, fixed by its place among the library's registered
variants. Legends sit inside the figure, below the panels, in as many columns as fit its width. Every
log axis carries at least two labelled ticks, whatever the span of its data (:func:`log_axis`). The
panels of a chart share their y axis, so that one height is one value in every panel. Every file
carries :data:`CHART_VERSION`, the hash of the chart code that drew it (:func:`stamp`).
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, on machines without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    NullLocator,
)

from .. import dtypes, registry  # noqa: E402

SHAPE = ["H", "HV", "K", "V"]  # the columns of a panel's shape
# The chart code's version: a hash of its modules' source, so that any change to how a chart is drawn
# tells a chart file drawn before it (tests/test_plots.py checks the committed ones)
CHART_MODULES = ("chart_style.py", "plots.py", "mode_charts.py")
CHART_SOURCE = "".join((Path(__file__).parent / m).read_text().replace("\r\n", "\n") for m in CHART_MODULES)
CHART_VERSION = hashlib.sha256(CHART_SOURCE.encode()).hexdigest()[:12]
STAMP = re.compile(rb"kda_impls chart version ([0-9a-f]{12})")
FORMATS = ("png", "svg", "pdf")  # the formats whose files carry the stamp
MIN_WIDTH = 8.0  # inches
CHARS_PER_INCH = 12  # of 10-point text, to wrap titles and lay out legends
# by the implementations' ``library``
LIBRARY_COLORS = {"torch": "#7f7f7f", "kda-impls": "#d62728", "fla": "#1f77b4", "flashinfer": "#2ca02c"}
OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e")
# a library's variants side by side: tab10 without its grey (the naive reference's colour)
VARIANT_COLORS = tuple(c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
LIBRARY_MARKERS = {"torch": "s", "kda-impls": "o", "fla": "^", "flashinfer": "D"}
# log-axis tick candidates per decade, sparsest first (:func:`log_ticks`)
TICK_MANTISSAS = ((1,), (1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9))


def _stable_index(name: str, n: int) -> int:
    return zlib.crc32(name.encode()) % n


def library_style(library: str) -> dict:
    """``color`` and ``marker`` of ``library`` in every chart of every run."""
    color = LIBRARY_COLORS.get(library) or OTHER_COLORS[_stable_index(library, len(OTHER_COLORS))]
    marker = LIBRARY_MARKERS.get(library) or MARKERS[_stable_index(library, len(MARKERS))]
    return dict(color=color, marker=marker, linestyle="-")


def variant_style(impl: str) -> dict:
    """``color`` and ``marker`` of ``impl`` among its library's variants (the name up to the first '-'):
    its place among the registered ones, so that one variant looks the same in every run."""
    library = impl.split("-")[0]
    siblings = [name for name in registry.BUILTIN if name.split("-")[0] == library]
    index = siblings.index(impl) if impl in siblings else _stable_index(impl, len(VARIANT_COLORS))
    return dict(color=VARIANT_COLORS[index % len(VARIANT_COLORS)], marker=MARKERS[index % len(MARKERS)],
                linestyle="-")


def stamp(fmt: str) -> dict:
    """savefig's ``metadata`` that puts :data:`CHART_VERSION` into a file of format ``fmt``, where
    :func:`stamped_version` reads it back."""
    assert fmt in FORMATS, fmt
    return {"Creator": f"kda_impls chart version {CHART_VERSION}"}


def stamped_version(path: Path) -> str | None:
    """The chart version a file of :func:`stamp` carries; None where it carries none."""
    found = STAMP.search(Path(path).read_bytes())
    return found and found.group(1).decode()


def title(text: str, meta: dict, table: pd.DataFrame, chars: int, left_out: dict[str, int] | None = None) -> str:
    """The chart, then the device, L2 entry state and library versions (as the implementations report
    them), then how many rows are not drawn and why: the rows that are not ok by status, the ok rows
    the chart leaves out by ``left_out`` ({why: rows}); wrapped between items, never inside one."""
    device = meta["device"]
    gpu = device["name"] + (f" (sm_{device['compute_capability'].replace('.', '')})"
                            if device.get("compute_capability") else "")
    versions = {n: v for n, v in meta.get("versions", {}).items() if v and v != "not installed" and n != "python"}
    ordered = sorted(versions, key=lambda n: (n not in ("torch", "triton"), n))
    entry = meta.get("settings", {}).get("method", {}).get("entry")
    about = [gpu, *([f"L2 entry: {entry}"] if entry and device.get("type") == "cuda" else []),
             *(f"{n} {versions[n]}" for n in ordered)]
    skipped = [f"{n} {s} rows" for s, n in table.status.value_counts().drop("ok", errors="ignore").items()]
    skipped += [f"{n} ok rows {why}" for why, n in (left_out or {}).items() if n]
    if skipped:
        about.append("not drawn: " + ", ".join(skipped))
    return f"KDA decode · {text}\n" + "\n".join(balanced_lines(about, chars))


def left_out(rows: pd.DataFrame, panels: list[tuple[tuple, pd.DataFrame]], why: str) -> dict[str, int]:
    """{why: how many of ``rows`` no panel of ``panels`` draws}, for :func:`title`."""
    return {why: len(rows) - sum(len(r) for _, r in panels)}


def balanced_lines(items: list[str], chars: int, sep: str = " · ") -> list[str]:
    """``items`` joined by ``sep`` on as few lines of at most ``chars`` as they fit, the items spread
    evenly over those lines (no line a lone word), an item never split."""
    lines = max(1, math.ceil(len(sep.join(items)) / chars))
    while True:
        target = len(sep.join(items)) / lines
        out, current = [], []
        for item in items:
            if current and len(sep.join(current + [item])) > target + len(item) / 2 and len(out) < lines - 1:
                out.append(sep.join(current))
                current = []
            current.append(item)
        out.append(sep.join(current))
        if all(len(line) <= chars for line in out) or lines >= len(items):
            return out
        lines += 1


def figure(n_panels: int, text: str, meta: dict, table: pd.DataFrame, *, cols: int = 3, width: float = 5.2,
           height: float = 3.9, left_out: dict[str, int] | None = None):
    """A figure of ``n_panels`` panels sharing their y axis, under the :func:`title` of ``text``:
    (figure, the panels' axes). Every panel is drawn: the figure grows a row per ``cols`` panels."""
    cols = 2 if n_panels == 4 else min(cols, n_panels)
    rows = math.ceil(n_panels / cols)
    fig_width = max(width * cols, MIN_WIDTH)  # room for the title and legend above one narrow panel
    fig, axes = plt.subplots(rows, cols, figsize=(fig_width, height * rows + 1.3), squeeze=False, sharey=True,
                             layout="constrained")
    for ax in axes.flat:
        ax.yaxis.set_tick_params(labelleft=True)  # shared, yet labelled on every panel: each is read alone too
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    fig.suptitle(title(text, meta, table, int(CHARS_PER_INCH * fig_width), left_out), fontsize=10)
    return fig, list(axes.flat[:n_panels])


def legend(fig, handles: list, labels: list[str]) -> None:
    """Below the panels, inside the figure: in the most columns whose widest labels fit its width
    (matplotlib fills a legend column by column)."""
    room = fig.get_figwidth() * CHARS_PER_INCH
    for ncols in range(len(labels), 0, -1):
        per_column = math.ceil(len(labels) / ncols)
        columns = [labels[i:i + per_column] for i in range(0, len(labels), per_column)]
        if sum(max(map(len, column)) + 6 for column in columns) <= room:  # 6: the handle and the gap
            break
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)


def handles(styles: dict[str, dict]) -> tuple[list, list[str]]:
    """Legend handles and labels of ``styles`` ({label: line style}), in its order."""
    return [Line2D([], [], ms=3.5, **look) for look in styles.values()], list(styles)


def log_ticks(lo: float, hi: float) -> list[float]:
    """At least two ticks within [lo, hi] (lo > 0): decades where the span holds two, else 1-2-5, else
    every mantissa, else evenly spaced round numbers."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas in TICK_MANTISSAS:
        ticks = [m * 10.0 ** e for e in range(first, last + 1) for m in mantissas if lo <= m * 10.0 ** e <= hi]
        if len(ticks) >= 2:
            return ticks
    return [t for t in MaxNLocator(nbins=3, min_n_ticks=2).tick_values(lo, hi) if lo <= t <= hi]


def log_axis(ax, which: str = "y") -> None:
    """Log scale with plain numbers and at least two labelled ticks (:func:`log_ticks`) in the data's
    range; unlabelled minor ticks between."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    ax.autoscale_view()
    lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
    axis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(LogLocator(subs="auto"))
    axis.set_minor_formatter(NullFormatter())


def ratio_axis(ax, ratios: pd.Series) -> None:
    """A y axis of ratios with labelled ticks whatever their span: linear ticks (at least four) on
    a narrow span, powers of two on a wide one (a log axis over 0.8-1.3 shows only "1x")."""
    lo, hi = min(ratios.min(), 1.0), max(ratios.max(), 1.0)
    if hi / lo > 4:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}×" if y >= 1 else f"1/{1 / y:g}×"))
        return
    pad = 0.08 * (hi - lo) or 0.05
    ax.set_ylim(lo - pad, hi + pad)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], min_n_ticks=4))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.3g}×"))


def count_axis(ax, values, label: str) -> None:
    """A log-2 x axis ticked and labelled at exactly ``values`` (batches, tokens per row)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(values))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)
    ax.grid(True, which="major", alpha=0.3)


def shape_label(key: tuple) -> str:
    H, HV, K, V, dtype, T, checkpoints, mode, ring = key
    tokens = (f", T={T} frozen verify" if mode == "frozen" else f", replay, a ring of {ring} records"
              if mode == "replay" else "" if T == 1 else f", T={T} ({checkpoints} checkpoints)")
    return f"H={H} HV={HV} K={K} V={V}, {dtypes.short(dtype)} state{tokens}"


def plasma(n: int):
    """``n`` distinct colours of one ordered series (slot paddings)."""
    return plt.get_cmap("plasma")(np.linspace(0.15, 0.75, n))


class Lines:
    """What a chart's lines are: ``rows`` with a ``line`` column, each line's style and legend label."""

    def __init__(self, rows: pd.DataFrame, styles: dict[str, dict], labels: dict[str, str]):
        self.rows, self.styles, self.labels = rows, styles, labels

    def legend(self, names) -> tuple[list, list[str]]:
        """Handles and labels of the lines ``names``, in the order of ``styles``."""
        shown = [n for n in self.styles if n in set(names)]
        marks, _ = handles({n: self.styles[n] for n in shown})
        return marks, [self.labels[n] for n in shown]


# (mode, checkpoints): line style and legend label
STORES = {("inplace", "all"): ("-", "in place, the state stored after every token"),
          ("inplace", "last"): ("--", "in place, after the last token only"),
          ("frozen", "all"): (":", "frozen verify, nothing stored")}


def store_legend(handles: list, labels: list, rows: pd.DataFrame) -> tuple[list, list]:
    """``handles`` and ``labels`` with a line-style entry for each (mode, checkpoints) among ``rows``."""
    for kind in [k for k in STORES if k in set(zip(rows["mode"], rows.checkpoints, strict=True))]:
        handles.append(Line2D([], [], color="0.3", ls=STORES[kind][0]))
        labels.append(STORES[kind][1])
    return handles, labels
