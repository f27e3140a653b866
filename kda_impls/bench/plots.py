"""Charts of a sweep directory, as PNG and SVG beside its results.csv.

- latency: kernel time against batch per implementation (log-log; the kernel time, the band the
  placements' min..max) and, dotted, the latency of one eager call;
- bandwidth: bytes moved / kernel time against batch, with the measured copy bandwidth (roofline);
- speedup: kernel-time ratio to a baseline implementation against batch;
- heatmap: share of the copy roofline over HV x (K, V) at one batch;
- slot_padding: kernel-time overhead of padded state slots over unpadded ones;
- tokens_time, tokens_bandwidth: speculative verify, kernel time and bandwidth against the tokens
  per row T (solid: the state stored after every token; dashed: after the last only).

Only ``ok`` rows are drawn; the title counts the others. The batch charts draw one panel per shape
and state dtype that has several batches (at the shape's least slot padding, without padding rows).
Every implementation keeps one colour (its library's) and marker in every chart of every run.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, on machines without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator  # noqa: E402

from .. import dtypes, registry  # noqa: E402
from ..cli import Parser, fail  # noqa: E402
from .case import CONFIG_COLUMNS  # noqa: E402
from .results import SweepDirError, kernel_time_words, load  # noqa: E402

SHAPE = ["H", "HV", "K", "V"]
CONFIG = [c for c in CONFIG_COLUMNS if c not in ("impl", "B")]  # a panel's line: one configuration over B
MAX_PANELS = 6
MIN_WIDTH = 8.0  # inches
CHARS_PER_INCH = 12  # of 10-point text, to wrap titles and lay out legends
FORMATS = ("png", "svg")


# One colour per library and one marker per implementation, fixed, so that a chart of any run
# reads like every other: the registered implementations in registry order, others by name hash.
LIBRARY_COLORS = {"naive": "#7f7f7f", "triton": "#d62728", "fla": "#1f77b4", "flashinfer": "#2ca02c"}
OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
LINESTYLES = ("-", "--", "-.", ":")


def _stable_index(name: str, n: int) -> int:
    return zlib.crc32(name.encode()) % n


def style(impl: str) -> dict:
    """``color``, ``marker`` and ``linestyle`` of ``impl`` in every chart of every run: its library's
    colour (the name up to the first '-'), and its place among that library's registered variants."""
    library = impl.split("-")[0]
    color = LIBRARY_COLORS.get(library) or OTHER_COLORS[_stable_index(library, len(OTHER_COLORS))]
    siblings = [name for name in registry.BUILTIN if name.split("-")[0] == library]
    index = siblings.index(impl) if impl in siblings else _stable_index(impl, len(MARKERS))
    return dict(color=color, marker=MARKERS[index % len(MARKERS)], linestyle=LINESTYLES[index % len(LINESTYLES)])


def _title(title: str, meta: dict, table: pd.DataFrame, chars: int) -> str:
    """The chart, then the device, L2 entry state and library versions (as the implementations report
    them), then how many rows are not drawn and why; wrapped between items, never inside one."""
    device = meta["device"]
    gpu = device["name"] + (f" (sm_{device['compute_capability'].replace('.', '')})"
                            if device.get("compute_capability") else "")
    versions = {n: v for n, v in meta.get("versions", {}).items() if v and v != "not installed" and n != "python"}
    ordered = sorted(versions, key=lambda n: (n not in ("torch", "triton"), n))
    entry = meta.get("settings", {}).get("method", {}).get("entry")
    about = [gpu, *([f"L2 entry: {entry}"] if entry and device.get("type") == "cuda" else []),
             *(f"{n} {versions[n]}" for n in ordered)]
    skipped = table.status.value_counts().drop("ok", errors="ignore")
    if not skipped.empty:
        about.append("not drawn: " + ", ".join(f"{n} {s}" for s, n in skipped.items()) + " rows")
    return f"KDA decode · {title}\n" + "\n".join(_balanced_lines(about, chars))


def _balanced_lines(items: list[str], chars: int, sep: str = " · ") -> list[str]:
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


def _figure(n_panels: int, title: str, meta: dict, table: pd.DataFrame, *, cols: int = 3,
            width: float = 5.2, height: float = 3.9):
    cols = 2 if n_panels == 4 else min(cols, n_panels)
    rows = math.ceil(n_panels / cols)
    fig_width = max(width * cols, MIN_WIDTH)  # room for the title and legend above one narrow panel
    fig, axes = plt.subplots(rows, cols, figsize=(fig_width, height * rows + 1.3), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    fig.suptitle(_title(title, meta, table, int(CHARS_PER_INCH * fig_width)), fontsize=10)
    return fig, list(axes.flat[:n_panels])


def _legend(fig, handles: list, labels: list[str]) -> None:
    mean_chars = sum(map(len, labels)) / len(labels) + 6  # with the handle
    ncols = max(1, min(len(labels), int(fig.get_figwidth() * CHARS_PER_INCH / mean_chars)))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)


def _impl_handles(impls) -> tuple[list, list[str]]:
    impls = sorted(impls)
    return [Line2D([], [], ms=3.5, **style(i)) for i in impls], impls


def _log_y(ax) -> None:
    """Log y axis with plain numbers; minor ticks labelled only when the data span less than a
    decade (else there would be no label at all, or a crowd of them)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if hi / lo < 10 else NullFormatter())


def _ratio_y(ax, ratios: pd.Series) -> None:
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


def _shape_label(key: tuple) -> str:
    H, HV, K, V, dtype, T, checkpoints = key
    tokens = "" if T == 1 else f", T={T} ({checkpoints} checkpoints)"
    return f"H={H} HV={HV} K={K} V={V}, {dtypes.short(dtype)} state{tokens}"


def _batch_axis(ax, batches) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch B")
    ax.grid(True, which="major", alpha=0.3)


def _batch_panels(ok: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(shape + state dtype, rows) with at least two batches, at the shape's least slot padding and
    without padding rows; the most populated first."""
    base = ok[ok.pad_rows == 0]
    base = base[base.slot_pad == base.groupby(SHAPE)["slot_pad"].transform("min")]
    panels = [(key, rows) for key, rows in base.groupby([*SHAPE, "state_dtype", "T", "checkpoints"])
              if rows.B.nunique() >= 2]
    panels.sort(key=lambda kr: -len(kr[1]))
    return panels[:MAX_PANELS]


def latency(ok, table, meta, **_):
    panels = _batch_panels(ok)
    if not panels:
        return None
    fig, axes = _figure(len(panels), "latency against batch", meta, table)
    for ax, (key, rows) in zip(axes, panels):
        for impl, r in rows.sort_values("B").groupby("impl"):
            look = style(impl)
            ax.fill_between(r.B, r.kernel_us_placement_min, r.kernel_us_placement_max, color=look["color"],
                            alpha=0.25, lw=0)
            ax.plot(r.B, r.kernel_us_mean, ms=3.5, **look)
            ax.plot(r.B, r.call_us_median, ":", color=look["color"], lw=1, alpha=0.8)
        _log_y(ax)
        _batch_axis(ax, rows.B.unique())
        ax.set_ylabel("µs")
        ax.set_title(_shape_label(key), fontsize=9)
    handles, labels = _impl_handles(pd.concat([r for _, r in panels]).impl.unique())
    handles += [Line2D([], [], color="0.3", marker="o", ms=3.5), Line2D([], [], color="0.3", ls=":", lw=1)]
    _legend(fig, handles, labels + [f"kernel time ({kernel_time_words(meta)}; band: their min–max)",
                                    "one eager call (median)"])
    return fig


def bandwidth(ok, table, meta, **_):
    panels = _batch_panels(ok)
    if not panels:
        return None
    fig, axes = _figure(len(panels), "bandwidth against batch", meta, table)
    roof = meta["copy_bandwidth_Bps"] / 1e9
    for ax, (key, rows) in zip(axes, panels):
        for impl, r in rows.sort_values("B").groupby("impl"):
            ax.plot(r.B, r.gbps, ms=3.5, **style(impl))
        ax.axhline(roof, color="k", ls=":", lw=1.2)
        ax.set_ylim(0, roof * 1.08)
        _batch_axis(ax, rows.B.unique())
        ax.set_ylabel("GB/s (bytes moved / kernel time)")
        ax.set_title(_shape_label(key), fontsize=9)
    handles, labels = _impl_handles(pd.concat([r for _, r in panels]).impl.unique())
    handles.append(Line2D([], [], color="k", ls=":", lw=1.2))
    _legend(fig, handles, labels + [f"measured device copy: {roof:,.4g} GB/s"])
    return fig


def speedup(ok, table, meta, baseline=None, **_):
    baseline = baseline or ("flashinfer" if (ok.impl == "flashinfer").any() else "naive")
    base = ok[ok.impl == baseline][[*CONFIG, "B", "kernel_us_mean"]]
    joined = ok[ok.impl != baseline].merge(base, on=[*CONFIG, "B"], suffixes=("", "_base"))
    joined["speedup"] = joined.kernel_us_mean_base / joined.kernel_us_mean
    panels = [(key, joined.merge(rows[[*CONFIG, "B"]].drop_duplicates())) for key, rows in _batch_panels(ok)]
    panels = [(key, rows) for key, rows in panels if not rows.empty]
    if not panels:
        return None
    fig, axes = _figure(len(panels), f"speedup over {baseline} (kernel time)", meta, table)
    for ax, (key, rows) in zip(axes, panels):
        for impl, r in rows.sort_values("B").groupby("impl"):
            ax.plot(r.B, r.speedup, ms=3.5, **style(impl))
        ax.axhline(1, color=style(baseline)["color"], ls=":", lw=1.2)
        _ratio_y(ax, rows.speedup)
        _batch_axis(ax, rows.B.unique())
        ax.set_ylabel(f"{baseline} time / time")
        ax.set_title(_shape_label(key), fontsize=9)
    handles, labels = _impl_handles(joined.impl.unique())
    handles.append(Line2D([], [], color=style(baseline)["color"], ls=":", lw=1.2))
    _legend(fig, handles, labels + [f"{baseline} (1×)"])
    return fig


def heatmap(ok, table, meta, batch=None, **_):
    """Share of the copy roofline over HV x (K, V) at one batch (default: the batch with the most
    shapes, the largest of those), for H == HV, no slot padding or padding rows, and the most common
    state dtype."""
    rows = ok[(ok.H == ok.HV) & (ok.pad_rows == 0) & (ok.slot_pad == 0) & (ok["T"] == 1)]
    if rows.empty:
        return None
    rows = rows[rows.state_dtype == rows.state_dtype.mode()[0]]
    shapes_per_batch = rows.drop_duplicates(["B", "HV", "K", "V"]).B.value_counts()
    if batch is None:
        batch = shapes_per_batch[shapes_per_batch == shapes_per_batch.max()].index.max()
    rows = rows[rows.B == batch]
    if shapes_per_batch.get(batch, 0) < 2:
        return None
    impls = sorted(rows.impl.unique())
    kv = sorted(set(zip(rows.K, rows.V)))
    hvs = sorted(rows.HV.unique())
    dtype = dtypes.short(rows.state_dtype.iloc[0])
    fig, axes = _figure(len(impls), f"share of the copy roofline at B={batch}, {dtype} state, H = HV", meta, table,
                        cols=2, width=0.62 * len(kv) + 1.6, height=0.5 * len(hvs) + 1.6)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.92")
    for ax, impl in zip(axes, impls):
        mine = rows[rows.impl == impl]
        frac = mine.set_index(["HV", "K", "V"]).roofline_frac
        grid = np.array([[frac.get((hv, k, v), np.nan) for k, v in kv] for hv in hvs])
        image = ax.imshow(np.ma.masked_invalid(grid * 100), vmin=0, vmax=100, cmap=cmap, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            ax.text(j, i, "–" if np.isnan(value) else f"{value:.0%}", ha="center", va="center", fontsize=8,
                    color="0.5" if np.isnan(value) else ("white" if value < 0.6 else "black"))
        ax.set_xticks(range(len(kv)), [f"{k}×{v}" for k, v in kv], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(hvs)), [str(h) for h in hvs])
        ax.set_xlabel("K × V")
        ax.set_ylabel("HV")
        ax.set_title(impl, fontsize=10, color=style(impl)["color"])
    fig.colorbar(image, ax=axes, label="% of measured copy bandwidth", shrink=0.9)
    return fig


def slot_padding(ok, table, meta, **_):
    """Kernel-time overhead of each slot padding over the least padding at the same shape, state
    dtype and batch, per implementation, for the shape measured with the most paddings."""
    rows = ok[(ok.pad_rows == 0) & (ok["T"] == 1)]
    paddings = rows.groupby(SHAPE).slot_pad.nunique()
    if paddings.empty or paddings.max() < 2:
        return None
    shape = paddings.idxmax()
    rows = rows.groupby(SHAPE).get_group(shape)
    least = rows.slot_pad.min()
    base = rows[rows.slot_pad == least][["impl", "state_dtype", "B", "kernel_us_mean"]]
    padded = rows[rows.slot_pad != least].merge(base, on=["impl", "state_dtype", "B"], suffixes=("", "_base"))
    if padded.empty:
        return None
    padded["overhead"] = padded.kernel_us_mean / padded.kernel_us_mean_base - 1
    impls = sorted(padded.impl.unique())
    pads = sorted(padded.slot_pad.unique())
    state_dtypes = sorted(padded.state_dtype.unique())
    pad_color = dict(zip(pads, plt.get_cmap("plasma")(np.linspace(0.15, 0.75, len(pads)))))
    dtype_style = dict(zip(state_dtypes, ["-", "--", ":"]))
    H, HV, K, V = shape
    fig, axes = _figure(len(impls), f"slot padding overhead at H={H} HV={HV} K={K} V={V} (vs slot_pad={least})",
                        meta, table)
    for ax, impl in zip(axes, impls):
        for (pad, dtype), r in padded[padded.impl == impl].sort_values("B").groupby(["slot_pad", "state_dtype"]):
            ax.plot(r.B, 100 * r.overhead, dtype_style[dtype], marker="o", ms=3, color=pad_color[pad])
        ax.axhline(0, color="0.4", lw=0.8)
        _batch_axis(ax, padded.B.unique())
        ax.set_ylabel("% kernel time over unpadded")
        ax.set_title(impl, fontsize=10, color=style(impl)["color"])
    handles = [Line2D([], [], color=pad_color[p], marker="o", ms=3) for p in pads]
    handles += [Line2D([], [], color="0.3", ls=dtype_style[d]) for d in state_dtypes]
    _legend(fig, handles, [f"slot_pad={p}" for p in pads] + [f"{dtypes.short(d)} state" for d in state_dtypes])
    return fig


def _token_panels(ok: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(state dtype, B, shape) with rows at several T, unpadded; T = 1 rows join both checkpoint kinds."""
    rows = ok[(ok.pad_rows == 0) & (ok.slot_pad == 0)]
    panels = [(key, r) for key, r in rows.groupby(["state_dtype", "B", *SHAPE]) if r["T"].nunique() >= 2]
    return panels[:2 * MAX_PANELS]


def _token_lines(rows: pd.DataFrame):
    """(impl, checkpoints, rows over T) per line; T = 1 starts the line of either checkpoint kind."""
    for (impl, kind), r in rows[rows["T"] > 1].groupby(["impl", "checkpoints"]):
        one = rows[(rows.impl == impl) & (rows["T"] == 1)]
        yield impl, kind, pd.concat([one, r]).sort_values("T")


def _tokens_chart(ok, table, meta, what: str):
    panels = _token_panels(ok)
    if not panels:
        return None
    title = "speculative verify: kernel time against tokens per row" if what == "time" else \
        "speculative verify: bandwidth against tokens per row"
    fig, axes = _figure(len(panels), title, meta, table, cols=4, width=4.2, height=3.4)
    roof = meta.get("copy_bandwidth_Bps", 0) / 1e9
    for ax, ((dtype, B, *shape), rows) in zip(axes, panels):
        for impl, kind, r in _token_lines(rows):
            look = style(impl) | {"linestyle": "-" if kind == "all" else "--"}
            ax.plot(r["T"], r.kernel_us_mean if what == "time" else r.gbps, ms=3.5, **look)
        if what == "time":
            _log_y(ax)
            ax.set_ylabel("µs per step")
        else:
            ax.axhline(roof, color="k", ls=":", lw=1.2)
            ax.set_ylim(0, roof * 1.08)
            ax.set_ylabel("GB/s (bytes moved / kernel time)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(rows["T"].unique()))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("tokens per row T")
        ax.grid(True, which="major", alpha=0.3)
        H, HV, K, V = shape
        ax.set_title(f"B={B}, {dtypes.short(dtype)} state (H={H} HV={HV} K={K} V={V})", fontsize=9)
    handles, labels = _impl_handles(pd.concat([r for _, r in panels]).impl.unique())
    handles += [Line2D([], [], color="0.3", ls="-"), Line2D([], [], color="0.3", ls="--")]
    labels += ["state stored after every token", "after the last token only"]
    if what != "time":
        handles.append(Line2D([], [], color="k", ls=":", lw=1.2))
        labels.append(f"measured device copy: {roof:,.4g} GB/s")
    _legend(fig, handles, labels)
    return fig


def tokens_time(ok, table, meta, **_):
    return _tokens_chart(ok, table, meta, "time")


def tokens_bandwidth(ok, table, meta, **_):
    return _tokens_chart(ok, table, meta, "bandwidth")


CHARTS = {"latency": latency, "bandwidth": bandwidth, "speedup": speedup, "heatmap": heatmap,
          "slot_padding": slot_padding, "tokens_time": tokens_time, "tokens_bandwidth": tokens_bandwidth}


def plot_dir(out_dir: Path, *, baseline: str | None = None, batch: int | None = None) -> list[Path]:
    """Draw every chart the directory's rows allow; return the files written."""
    sweep = load(out_dir)
    if baseline is not None and baseline not in set(sweep.table.impl):
        raise ValueError(f"--baseline {baseline} is not in {sweep.path} (its implementations: "
                         f"{', '.join(sorted(set(sweep.table.impl)))})")
    written = []
    for name, chart in CHARTS.items():
        fig = chart(sweep.ok, sweep.table, sweep.meta, baseline=baseline, batch=batch)
        if fig is None:
            continue
        for fmt in FORMATS:
            path = sweep.path / f"{name}.{fmt}"
            fig.savefig(path, dpi=130)
            written.append(path)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="kda-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="a sweep directory (results.csv, meta.json)")
    parser.add_argument("--baseline", help="the speedup chart's denominator (default: flashinfer if present, else naive)")
    parser.add_argument("--batch", type=int, help="the heatmap's batch (default: the batch with the most shapes)")
    args = parser.parse_args(argv)
    try:
        written = plot_dir(args.dir, baseline=args.baseline, batch=args.batch)
    except (SweepDirError, ValueError) as exc:
        fail("kda-plot", str(exc))
    for path in written:
        print(path)
    if not written:
        print(f"no chart: {args.dir} has too few ok rows to draw")
