"""Charts of a sweep directory, as PNG and SVG: one chart per question.

The library charts draw each library at its best verified call: at every point the fastest ok variant
of the library (:func:`results.best_per_library`), one colour per library:

- latency: kernel time against batch (log-log; the band, the placements' min..max) and, dotted, the
  latency of one eager call of the same variant;
- bandwidth: bytes moved / kernel time against batch, with the measured copy bandwidth (roofline);
- speedup: kernel-time ratio to a baseline library (or one implementation) against batch;
- heatmap: share of the copy roofline over HV x (K, V) at one batch;
- slot_padding: kernel-time overhead of padded state slots over unpadded ones;
- tokens_time, tokens_bandwidth, modes_time, replay_time: the modes of a step (:mod:`.mode_charts`).

The variant charts (``variants_LIBRARY``, for each library with several variants in the run) draw the
kernel time of each of its variants against batch, a colour per variant: which call of a library to make.

Only ``ok`` rows are drawn; the title counts the others, and the ok rows a chart leaves out, by why.
The batch charts draw one panel for every configuration (shape, state dtype, tokens, mode), at the
shape's least slot padding and without padding rows; the panels of a chart share their y axis. Each
file is written to a temporary name and renamed, and carries the chart code's version
(:data:`.chart_style.CHART_VERSION`). ``kda-plot DIR`` writes into DIR only when git does not track it;
a tracked directory's charts are rewritten only when ``--out`` names where.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, on machines without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .. import dtypes  # noqa: E402
from ..cli import Parser, comma_list, fail  # noqa: E402
from . import chart_style as cs  # noqa: E402
from .case import CONFIG_COLUMNS  # noqa: E402
from .chart_style import SHAPE, Lines  # noqa: E402
from .mode_charts import modes_time, replay_time, tokens_chart  # noqa: E402
from .results import Sweep, SweepDirError, best_per_library, kernel_time_words, load  # noqa: E402

CONFIG = [c for c in CONFIG_COLUMNS if c not in ("impl", "B")]  # a panel's line: one configuration over B
FORMATS = ("png", "svg")  # the default of --format (chart_style.FORMATS: every format kda-plot writes)


def libraries(ok: pd.DataFrame) -> Lines:
    """Each library at its fastest ok variant per configuration, labelled with how many it had."""
    best = best_per_library(ok).assign(line=lambda t: t.library)
    variants = ok.groupby("library").impl.unique()
    names = sorted(variants.index)
    labels = {n: (n if variants[n][0] == n else f"{n} ({variants[n][0]})") if len(variants[n]) == 1
              else f"{n} (fastest of its {len(variants[n])} variants)" for n in names}
    return Lines(best, {n: cs.library_style(n) for n in names}, labels)


def variants(ok: pd.DataFrame, library: str) -> Lines:
    mine = ok[ok.library == library]
    names = sorted(mine.impl.unique())
    return Lines(mine.assign(line=mine.impl), {n: cs.variant_style(n) for n in names}, {n: n for n in names})


def _batch_panels(ok: pd.DataFrame) -> tuple[list[tuple[tuple, pd.DataFrame]], dict[str, int]]:
    """(panels, left out): (configuration, rows) of every configuration at the shape's least slot padding
    and without padding rows, those with the most batches first (one at one batch is a panel of points);
    and how many of ``ok`` no panel draws, by why."""
    padded = ok.pad_rows > 0
    base = ok[~padded]
    least = base.slot_pad == base.groupby(SHAPE)["slot_pad"].transform("min")
    kinds = [*SHAPE, "state_dtype", "T", "checkpoints", "mode", "ring"]
    panels = sorted(base[least].groupby(kinds, dropna=False), key=lambda kr: (-kr[1].B.nunique(), -len(kr[1])))
    return panels, {"with padding rows": int(padded.sum()),
                    "above their shape's least slot padding (slot_padding chart)": int((~least).sum())}


def latency(lines: Lines, table, meta, *, what: str = "latency against batch", eager: bool = True, **_):
    panels, left_out = _batch_panels(lines.rows)
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), what, meta, table, left_out=left_out)
    for ax, (key, rows) in zip(axes, panels, strict=True):
        for name, r in rows.sort_values("B").groupby("line"):
            look = lines.styles[name]
            if len(r) > 1:
                ax.fill_between(r.B, r.kernel_us_placement_min, r.kernel_us_placement_max, color=look["color"],
                                alpha=0.25, lw=0)
            else:  # one batch: the band as a bar
                ax.vlines(r.B, r.kernel_us_placement_min, r.kernel_us_placement_max, color=look["color"], alpha=0.4,
                          lw=4)
            ax.plot(r.B, r.kernel_us_mean, ms=3.5, **look)
            if eager:
                ax.plot(r.B, r.call_us_median, ":", color=look["color"], lw=1, alpha=0.8, marker=look["marker"],
                        ms=3.5, mfc="none")
        cs.count_axis(ax, rows.B.unique(), "batch B")
        ax.set_ylabel("µs")
        ax.set_title(cs.shape_label(key), fontsize=9)
    cs.log_axis(axes[0])  # shared: its limits and ticks hold every panel's data
    handles, labels = lines.legend(pd.concat([r for _, r in panels]).line.unique())
    handles.append(Line2D([], [], color="0.3", marker="o", ms=3.5))
    labels.append(f"kernel time ({kernel_time_words(meta)}; band: their min–max)")
    if eager:
        handles.append(Line2D([], [], color="0.3", ls=":", lw=1, marker="o", ms=3.5, mfc="none"))
        labels.append("one eager call of the same variant (median; hollow marker)")
    cs.legend(fig, handles, labels)
    return fig


def bandwidth(lines: Lines, table, meta, **_):
    panels, left_out = _batch_panels(lines.rows)
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), "bandwidth against batch", meta, table, left_out=left_out)
    roof = meta["copy_bandwidth_Bps"] / 1e9
    top = max(roof, *(rows.gbps.max() for _, rows in panels)) * 1.08  # a rate above the copy's stays in view
    for ax, (key, rows) in zip(axes, panels, strict=True):
        for name, r in rows.sort_values("B").groupby("line"):
            ax.plot(r.B, r.gbps, ms=3.5, **lines.styles[name])
        ax.axhline(roof, color="k", ls=":", lw=1.2)
        ax.set_ylim(0, top)
        cs.count_axis(ax, rows.B.unique(), "batch B")
        ax.set_ylabel("GB/s (bytes moved / kernel time)")
        ax.set_title(cs.shape_label(key), fontsize=9)
    handles, labels = lines.legend(pd.concat([r for _, r in panels]).line.unique())
    handles.append(Line2D([], [], color="k", ls=":", lw=1.2))
    cs.legend(fig, handles, labels + [f"measured device copy: {roof:,.4g} GB/s"])
    return fig


def speedup(lines: Lines, table, meta, baseline=None, ok=None, **_):
    """Kernel-time ratio of every library to ``baseline``: a library (at its best) or one implementation."""
    rows = lines.rows
    baseline = baseline or ("flashinfer" if (rows.line == "flashinfer").any() else "naive")
    base_rows = rows[rows.line == baseline] if (rows.line == baseline).any() else ok[ok.impl == baseline]
    base = base_rows[[*CONFIG, "B", "kernel_us_mean"]]
    joined = rows[rows.line != baseline].merge(base, on=[*CONFIG, "B"], suffixes=("", "_base"))
    joined["speedup"] = joined.kernel_us_mean_base / joined.kernel_us_mean
    batch_panels, left_out = _batch_panels(rows)
    panels = [(key, joined.merge(r[[*CONFIG, "B"]].drop_duplicates())) for key, r in batch_panels]
    left_out["of a configuration without the baseline"] = sum(len(r) for (_, r), (_, j) in zip(batch_panels, panels,
                                                                                                strict=True) if j.empty)
    panels = [(key, r) for key, r in panels if not r.empty]
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), f"speedup over {baseline} (kernel time)", meta, table, left_out=left_out)
    base_color = lines.styles.get(baseline, {"color": "0.3"})["color"]
    for ax, (key, r_all) in zip(axes, panels, strict=True):
        for name, r in r_all.sort_values("B").groupby("line"):
            ax.plot(r.B, r.speedup, ms=3.5, **lines.styles[name])
        ax.axhline(1, color=base_color, ls=":", lw=1.2)
        cs.count_axis(ax, r_all.B.unique(), "batch B")
        ax.set_ylabel(f"{baseline} time / time")
        ax.set_title(cs.shape_label(key), fontsize=9)
    cs.ratio_axis(axes[0], pd.concat([r.speedup for _, r in panels]))  # shared: every panel's ratios
    handles, labels = lines.legend(joined.line.unique())
    handles.append(Line2D([], [], color=base_color, ls=":", lw=1.2))
    cs.legend(fig, handles, labels + [f"{baseline} (1×)"])
    return fig


def heatmap(lines: Lines, table, meta, batch=None, **_):
    """Share of the copy roofline over HV x (K, V) at one batch (default: the batch with the most
    shapes, the largest of those), for H == HV, no slot padding or padding rows, and the most common
    state dtype."""
    ok = lines.rows
    rows = ok[(ok.H == ok.HV) & (ok.pad_rows == 0) & (ok.slot_pad == 0) & (ok["T"] == 1) & (ok["mode"] == "inplace")]
    if rows.empty:
        return None
    rows = rows[rows.state_dtype == rows.state_dtype.mode()[0]]
    shapes_per_batch = rows.drop_duplicates(["B", "HV", "K", "V"]).B.value_counts()
    if batch is None:
        batch = shapes_per_batch[shapes_per_batch == shapes_per_batch.max()].index.max()
    rows = rows[rows.B == batch]
    if shapes_per_batch.get(batch, 0) < 2:
        return None
    names = [n for n in lines.styles if n in set(rows.line)]
    kv = sorted(set(zip(rows.K, rows.V, strict=True)))
    hvs = sorted(rows.HV.unique())
    dtype = dtypes.short(rows.state_dtype.iloc[0])
    fig, axes = cs.figure(len(names), f"share of the copy roofline at B={batch}, {dtype} state, H = HV", meta, table,
                          cols=2, width=0.62 * len(kv) + 1.6, height=0.5 * len(hvs) + 1.6,
                          left_out={"at other batches, state dtypes or layouts (this map: unpadded one-token "
                                    "rows, H = HV)": len(ok) - len(rows)})
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.92")
    for ax, name in zip(axes, names, strict=True):
        frac = rows[rows.line == name].set_index(["HV", "K", "V"]).roofline_frac
        grid = np.array([[frac.get((hv, k, v), np.nan) for k, v in kv] for hv in hvs])
        image = ax.imshow(np.ma.masked_invalid(grid * 100), vmin=0, vmax=100, cmap=cmap, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            ax.text(j, i, "–" if np.isnan(value) else f"{value:.0%}", ha="center", va="center", fontsize=8,
                    color="0.5" if np.isnan(value) else ("white" if value < 0.6 else "black"))
        ax.set_xticks(range(len(kv)), [f"{k}×{v}" for k, v in kv], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(hvs)), [str(h) for h in hvs])
        ax.set_xlabel("K × V")
        ax.set_ylabel("HV")
        ax.set_title(lines.labels[name], fontsize=10, color=lines.styles[name]["color"])
    fig.colorbar(image, ax=axes, label="% of measured copy bandwidth", shrink=0.9)
    return fig


def slot_padding(lines: Lines, table, meta, **_):
    """Kernel-time overhead of each slot padding over the least padding at the same shape, state
    dtype and batch, per line, for the shape measured with the most paddings."""
    rows = lines.rows[(lines.rows.pad_rows == 0) & (lines.rows["T"] == 1) & (lines.rows["mode"] == "inplace")]
    paddings = rows.groupby(SHAPE).slot_pad.nunique()
    if paddings.empty or paddings.max() < 2:
        return None
    shape = paddings.idxmax()
    rows = rows.groupby(SHAPE).get_group(shape)
    least = rows.slot_pad.min()
    base = rows[rows.slot_pad == least][["line", "state_dtype", "B", "kernel_us_mean"]]
    padded = rows[rows.slot_pad != least].merge(base, on=["line", "state_dtype", "B"], suffixes=("", "_base"))
    if padded.empty:
        return None
    padded["overhead"] = padded.kernel_us_mean / padded.kernel_us_mean_base - 1
    names = [n for n in lines.styles if n in set(padded.line)]
    pads = sorted(padded.slot_pad.unique())
    state_dtypes = sorted(padded.state_dtype.unique())
    pad_color = dict(zip(pads, cs.plasma(len(pads)), strict=True))
    dtype_style = dict(zip(state_dtypes, ["-", "--", ":"], strict=False))
    H, HV, K, V = shape
    fig, axes = cs.figure(len(names), f"slot padding overhead at H={H} HV={HV} K={K} V={V} (vs slot_pad={least})",
                          meta, table, left_out={"of other shapes, padding rows or more tokens":
                                                 len(lines.rows) - len(padded) - len(base)})
    for ax, name in zip(axes, names, strict=True):
        for (pad, dtype), r in padded[padded.line == name].sort_values("B").groupby(["slot_pad", "state_dtype"]):
            ax.plot(r.B, 100 * r.overhead, dtype_style[dtype], marker="o", ms=3, color=pad_color[pad])
        ax.axhline(0, color="0.4", lw=0.8)
        cs.count_axis(ax, padded.B.unique(), "batch B")
        ax.set_ylabel("% kernel time over unpadded")
        ax.set_title(lines.labels[name], fontsize=10, color=lines.styles[name]["color"])
    handles = [Line2D([], [], color=pad_color[p], marker="o", ms=3) for p in pads]
    handles += [Line2D([], [], color="0.3", ls=dtype_style[d]) for d in state_dtypes]
    cs.legend(fig, handles, [f"slot_pad={p}" for p in pads] + [f"{dtypes.short(d)} state" for d in state_dtypes])
    return fig


CHARTS = {"latency": latency, "bandwidth": bandwidth, "speedup": speedup, "heatmap": heatmap,
          "slot_padding": slot_padding, "tokens_time": partial(tokens_chart, what="time"),
          "tokens_bandwidth": partial(tokens_chart, what="bandwidth"), "modes_time": modes_time,
          "replay_time": replay_time}


def figures(ok: pd.DataFrame, table: pd.DataFrame, meta: dict, *, baseline=None, batch=None):
    """(name, figure) of every chart the rows allow: the library charts, then each library's variants."""
    best = libraries(ok)
    for name, chart in CHARTS.items():
        yield name, chart(best, table, meta, baseline=baseline, batch=batch, ok=ok)
    for library in best.styles:
        mine = variants(ok, library)
        if len(mine.styles) >= 2:
            yield f"variants_{library}", latency(mine, table, meta, what=f"{library}'s variants: kernel time "
                                                 "against batch", eager=False)


def check_baseline(sweep: Sweep, baseline: str | None) -> None:
    """ValueError unless ``baseline`` is None or a library or implementation of the sweep."""
    known = set(sweep.table.impl) | set(sweep.table.library.dropna())
    if baseline is not None and baseline not in known:
        raise ValueError(f"--baseline {baseline} is not in {sweep.path} (its libraries and implementations: "
                         f"{', '.join(sorted(known))})")


def check_batch(sweep: Sweep, batch: int | None) -> None:
    """ValueError unless ``batch`` is None or a batch of the sweep's ok rows (the heatmap's)."""
    batches = sorted(sweep.ok.B.unique())
    if batch is not None and batch not in batches:
        raise ValueError(f"--batch {batch}: {sweep.path} has no ok rows at that batch (its batches: "
                         f"{', '.join(map(str, batches)) or 'none'})")


def save(fig, path: Path, fmt: str) -> None:
    """``fig`` as ``path``, whole or not at all: drawn into a temporary file beside it, then renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fig.savefig(tmp, format=fmt, dpi=130, metadata=cs.stamp(fmt))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the chart from the directory's other readers
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_dir(sweep_dir: Path, *, baseline: str | None = None, batch: int | None = None,
             out: Path | None = None, formats: tuple[str, ...] = FORMATS,
             charts: list[str] | None = None) -> list[Path]:
    """Draw every chart the directory's rows allow (of ``charts``, where given: names of :data:`CHARTS` or
    ``variants_LIBRARY``) into ``out`` (default: the sweep's own directory), in ``formats``; return the
    files written."""
    sweep = load(sweep_dir)
    check_baseline(sweep, baseline)
    check_batch(sweep, batch)
    out = Path(out) if out is not None else sweep.path
    written = []
    for name, fig in figures(sweep.ok, sweep.table, sweep.meta, baseline=baseline, batch=batch):
        if fig is None or charts is not None and name not in charts:
            plt.close(fig)
            continue
        for fmt in formats:
            save(fig, out / f"{name}.{fmt}", fmt)
            written.append(out / f"{name}.{fmt}")
        plt.close(fig)
    return written


def tracked_by_git(directory: Path) -> bool:
    """Whether git tracks any file in ``directory`` (False outside a git checkout, or without git)."""
    try:
        done = subprocess.run(["git", "-C", str(directory), "ls-files", "--", "."], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def chart_dir(sweep_dir: Path, out: Path | None) -> Path:
    """Where the charts go: ``out``; else the sweep's own directory unless git tracks it (ValueError:
    committed charts are rewritten only when asked)."""
    if out is not None:
        return out
    if tracked_by_git(sweep_dir):
        raise ValueError(f"{sweep_dir} is tracked by git, so its charts are left as they are; name where new "
                         f"ones go with --out DIR (--out {sweep_dir} rewrites them)")
    return sweep_dir


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="kda-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="a sweep directory (results.csv, meta.json)")
    parser.add_argument("--out", type=Path, help="where the charts go (default: DIR, unless git tracks it: then "
                                                 "--out is needed, DIR itself to rewrite its charts)")
    parser.add_argument("--baseline", help="the speedup chart's denominator: a library or an implementation "
                                           "(default: flashinfer if present, else naive)")
    parser.add_argument("--batch", type=int, help="the heatmap's batch (default: the batch with the most shapes)")
    parser.add_argument("--charts", type=comma_list(str), metavar="NAME,...",
                        help=f"only these charts ({', '.join(CHARTS)}, variants_LIBRARY; default: every one the rows "
                             f"allow)")
    parser.add_argument("--format", type=comma_list(str), default=FORMATS,
                        help=f"file formats, comma-separated: {', '.join(cs.FORMATS)} (default: {','.join(FORMATS)})")
    args = parser.parse_args(argv)
    unknown = [name for name in args.charts or () if name not in CHARTS and not name.startswith("variants_")]
    if unknown:
        parser.error(f"--charts: no chart {', '.join(unknown)} (the charts: {', '.join(CHARTS)}, variants_LIBRARY)")
    unknown = sorted(set(args.format) - set(cs.FORMATS))
    if unknown:
        parser.error(f"--format: {', '.join(unknown)} is not a format kda-plot writes ({', '.join(cs.FORMATS)}: "
                     f"those that carry the chart version)")
    try:  # a bad directory, baseline, batch or place: before anything is made
        sweep = load(args.dir)
        check_baseline(sweep, args.baseline)
        check_batch(sweep, args.batch)
        out = chart_dir(args.dir, args.out)
    except (SweepDirError, ValueError) as exc:
        fail("kda-plot", str(exc))
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # a probe, so that no chart half-draws into a read-only place
            pass
    except OSError as exc:
        fail("kda-plot", f"cannot write charts in {out}: {exc.strerror}; give a writable directory with --out DIR")
    try:
        written = plot_dir(args.dir, baseline=args.baseline, batch=args.batch, out=out, formats=args.format,
                           charts=args.charts)
    except OSError as exc:
        fail("kda-plot", f"cannot write charts in {out}: {exc.strerror}")
    for path in written:
        print(path)
    if not written:
        print(f"no chart: {args.dir} has too few ok rows to draw" + (" these charts" if args.charts else ""))


if __name__ == "__main__":  # python3 -m kda_impls.bench.plots: kda-plot from a checkout
    main()
