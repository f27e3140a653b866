"""Charts of a sweep directory, as PNG and SVG beside its results.csv.

- latency: kernel time against batch per implementation (log-log, band p25..p75) and, dashed, the
  latency of one eager call;
- bandwidth: bytes moved / kernel time against batch, with the measured copy bandwidth (roofline);
- speedup: kernel-time ratio to a baseline implementation against batch;
- heatmap: share of the copy roofline over HV x (K, V) at one batch;
- slot_padding: kernel-time overhead of padded state slots over unpadded ones.

Only ``ok`` rows are drawn; the title counts the others. The batch charts draw one panel per shape
and state dtype that has several batches (at the shape's least slot padding, without padding rows).
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, on machines without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

from .. import dtypes  # noqa: E402

SHAPE = ["H", "HV", "K", "V"]
CONFIG = [*SHAPE, "state_dtype", "slot_pad", "pad_rows"]
MAX_PANELS = 6
MIN_WIDTH = 8.0  # inches
CHARS_PER_INCH = 12  # of 10-point text, to wrap titles and lay out legends
FORMATS = ("png", "svg")


def load(out_dir: Path) -> tuple[pd.DataFrame, dict]:
    out_dir = Path(out_dir)
    return pd.read_csv(out_dir / "results.csv"), json.loads((out_dir / "meta.json").read_text())


def _colors(table: pd.DataFrame) -> dict[str, str]:
    """One colour per implementation, the same in every chart of the directory."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {impl: cycle[i % len(cycle)] for i, impl in enumerate(sorted(table.impl.unique()))}


def _title(title: str, meta: dict, table: pd.DataFrame, chars: int) -> str:
    """The chart, then the device, L2 regime and library versions (as the implementations report
    them), then how many rows are not drawn and why."""
    device = meta["device"]
    gpu = device["name"] + (f" (sm_{device['compute_capability'].replace('.', '')})"
                            if device.get("compute_capability") else "")
    versions = {n: v for n, v in meta.get("versions", {}).items() if v and v != "not installed" and n != "python"}
    ordered = sorted(versions, key=lambda n: (n not in ("torch", "triton"), n))
    about = [gpu, "L2-cold" if meta["settings"]["l2_cold"] else "L2-hot", *(f"{n} {versions[n]}" for n in ordered)]
    skipped = table.status.value_counts().drop("ok", errors="ignore")
    if not skipped.empty:
        about.append("not drawn: " + ", ".join(f"{n} {s}" for s, n in skipped.items()) + " rows")
    return f"KDA decode · {title}\n" + textwrap.fill(" · ".join(about), chars)


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


def _impl_handles(impls, colors) -> tuple[list, list[str]]:
    impls = sorted(impls)
    return [Line2D([], [], color=colors[i], marker="o", ms=3.5) for i in impls], impls


def _log_y(ax) -> None:
    """Log y axis with plain numbers; minor ticks labelled only when the data span less than a
    decade (else there would be no label at all, or a crowd of them)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if hi / lo < 10 else NullFormatter())


def _shape_label(key: tuple) -> str:
    H, HV, K, V, dtype = key
    return f"H={H} HV={HV} K={K} V={V}, {dtypes.short(dtype)} state"


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
    panels = [(key, rows) for key, rows in base.groupby([*SHAPE, "state_dtype"]) if rows.B.nunique() >= 2]
    panels.sort(key=lambda kr: -len(kr[1]))
    return panels[:MAX_PANELS]


def latency(ok, table, meta, colors, **_):
    panels = _batch_panels(ok)
    if not panels:
        return None
    fig, axes = _figure(len(panels), "latency against batch", meta, table)
    for ax, (key, rows) in zip(axes, panels):
        for impl, r in rows.sort_values("B").groupby("impl"):
            ax.fill_between(r.B, r.kernel_us_p25, r.kernel_us_p75, color=colors[impl], alpha=0.25, lw=0)
            ax.plot(r.B, r.kernel_us_median, "o-", color=colors[impl], ms=3.5)
            ax.plot(r.B, r.call_us_median, "--", color=colors[impl], lw=1, alpha=0.8)
        _log_y(ax)
        _batch_axis(ax, rows.B.unique())
        ax.set_ylabel("µs")
        ax.set_title(_shape_label(key), fontsize=9)
    handles, labels = _impl_handles(pd.concat([r for _, r in panels]).impl.unique(), colors)
    handles += [Line2D([], [], color="0.3", marker="o", ms=3.5), Line2D([], [], color="0.3", ls="--", lw=1)]
    _legend(fig, handles, labels + ["kernel time (median; band p25–p75)", "one eager call (median)"])
    return fig


def bandwidth(ok, table, meta, colors, **_):
    panels = _batch_panels(ok)
    if not panels:
        return None
    fig, axes = _figure(len(panels), "bandwidth against batch", meta, table)
    roof = meta["copy_bandwidth_Bps"] / 1e9
    for ax, (key, rows) in zip(axes, panels):
        for impl, r in rows.sort_values("B").groupby("impl"):
            ax.plot(r.B, r.gbps, "o-", color=colors[impl], ms=3.5)
        ax.axhline(roof, color="k", ls=":", lw=1.2)
        ax.set_ylim(0, roof * 1.08)
        _batch_axis(ax, rows.B.unique())
        ax.set_ylabel("GB/s (bytes moved / kernel time)")
        ax.set_title(_shape_label(key), fontsize=9)
    handles, labels = _impl_handles(pd.concat([r for _, r in panels]).impl.unique(), colors)
    handles.append(Line2D([], [], color="k", ls=":", lw=1.2))
    _legend(fig, handles, labels + [f"measured device copy: {roof:,.4g} GB/s"])
    return fig


def speedup(ok, table, meta, colors, baseline=None, **_):
    baseline = baseline or ("flashinfer" if (ok.impl == "flashinfer").any() else "naive")
    base = ok[ok.impl == baseline][[*CONFIG, "B", "kernel_us_median"]]
    joined = ok[ok.impl != baseline].merge(base, on=[*CONFIG, "B"], suffixes=("", "_base"))
    joined["speedup"] = joined.kernel_us_median_base / joined.kernel_us_median
    panels = [(key, joined.merge(rows[[*CONFIG, "B"]].drop_duplicates())) for key, rows in _batch_panels(ok)]
    panels = [(key, rows) for key, rows in panels if not rows.empty]
    if not panels:
        return None
    fig, axes = _figure(len(panels), f"speedup over {baseline} (kernel time)", meta, table)
    for ax, (key, rows) in zip(axes, panels):
        for impl, r in rows.sort_values("B").groupby("impl"):
            ax.plot(r.B, r.speedup, "o-", color=colors[impl], ms=3.5)
        ax.axhline(1, color=colors[baseline], ls=":", lw=1.2)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}×" if y >= 1 else f"1/{1 / y:g}×"))
        _batch_axis(ax, rows.B.unique())
        ax.set_ylabel(f"{baseline} time / time")
        ax.set_title(_shape_label(key), fontsize=9)
    handles, labels = _impl_handles(joined.impl.unique(), colors)
    handles.append(Line2D([], [], color=colors[baseline], ls=":", lw=1.2))
    _legend(fig, handles, labels + [f"{baseline} (1×)"])
    return fig


def heatmap(ok, table, meta, colors, batch=None, **_):
    """Share of the copy roofline over HV x (K, V) at one batch (default: the batch with the most
    shapes, the largest of those), for H == HV, no slot padding or padding rows, and the most common
    state dtype."""
    rows = ok[(ok.H == ok.HV) & (ok.pad_rows == 0) & (ok.slot_pad == 0)]
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
        ax.set_title(impl, fontsize=10, color=colors[impl])
    fig.colorbar(image, ax=axes, label="% of measured copy bandwidth", shrink=0.9)
    return fig


def slot_padding(ok, table, meta, colors, **_):
    """Kernel-time overhead of each slot padding over the least padding at the same shape, state
    dtype and batch, per implementation, for the shape measured with the most paddings."""
    rows = ok[ok.pad_rows == 0]
    paddings = rows.groupby(SHAPE).slot_pad.nunique()
    if paddings.empty or paddings.max() < 2:
        return None
    shape = paddings.idxmax()
    rows = rows.groupby(SHAPE).get_group(shape)
    least = rows.slot_pad.min()
    base = rows[rows.slot_pad == least][["impl", "state_dtype", "B", "kernel_us_median"]]
    padded = rows[rows.slot_pad != least].merge(base, on=["impl", "state_dtype", "B"], suffixes=("", "_base"))
    if padded.empty:
        return None
    padded["overhead"] = padded.kernel_us_median / padded.kernel_us_median_base - 1
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
        ax.set_title(impl, fontsize=10, color=colors[impl])
    handles = [Line2D([], [], color=pad_color[p], marker="o", ms=3) for p in pads]
    handles += [Line2D([], [], color="0.3", ls=dtype_style[d]) for d in state_dtypes]
    _legend(fig, handles, [f"slot_pad={p}" for p in pads] + [f"{dtypes.short(d)} state" for d in state_dtypes])
    return fig


CHARTS = {"latency": latency, "bandwidth": bandwidth, "speedup": speedup, "heatmap": heatmap,
          "slot_padding": slot_padding}


def plot_dir(out_dir: Path, *, baseline: str | None = None, batch: int | None = None) -> list[Path]:
    """Draw every chart the directory's rows allow; return the files written."""
    out_dir = Path(out_dir)
    table, meta = load(out_dir)
    ok = table[table.status == "ok"]
    colors = _colors(table)
    written = []
    for name, chart in CHARTS.items():
        fig = chart(ok, table, meta, colors, baseline=baseline, batch=batch)
        if fig is None:
            continue
        for fmt in FORMATS:
            path = out_dir / f"{name}.{fmt}"
            fig.savefig(path, dpi=130)
            written.append(path)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/plot.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="a sweep directory (results.csv, meta.json)")
    parser.add_argument("--baseline", help="the speedup chart's denominator (default: flashinfer if present, else naive)")
    parser.add_argument("--batch", type=int, help="the heatmap's batch (default: the batch with the most shapes)")
    args = parser.parse_args(argv)
    for path in plot_dir(args.dir, baseline=args.baseline, batch=args.batch):
        print(path)
