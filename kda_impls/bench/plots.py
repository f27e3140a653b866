"""Charts of a sweep directory, as PNG and SVG: one chart per question.

The library charts draw each library at its best verified call: at every point the fastest ok variant
of the library (:func:`results.best_per_library`), one colour per library:

- latency: kernel time against batch (log-log; the band, the placements' min..max) and, dotted, the
  latency of one eager call of the same variant;
- bandwidth: bytes moved / kernel time against batch, with the measured copy bandwidth (roofline);
- speedup: kernel-time ratio to a baseline library (or one implementation) against batch;
- heatmap: share of the copy roofline over HV x (K, V) at one batch;
- slot_padding: kernel-time overhead of padded state slots over unpadded ones;
- tokens_time, tokens_bandwidth: speculative verify, kernel time and bandwidth against the tokens
  per row T (solid: the state stored after every token; dashed: after the last only; dotted: frozen verify);
- modes_time, replay_time: frozen verify against in-place decode of the same T tokens, and cached-input
  replay against in-place decode, kernel time per step against batch (:mod:`.mode_charts`).

The variant charts (``variants_LIBRARY``, for each library with several variants in the run) draw the
kernel time of each of its variants against batch, a colour per variant: which call of a library to make.

Only ``ok`` rows are drawn; the title counts the others. The batch charts draw one panel per shape
and state dtype that has several batches (at the shape's least slot padding, without padding rows).
``kda-plot DIR`` writes into DIR only when git does not track it; otherwise into a new directory, and
says so (``--out`` chooses): charts that are committed are rewritten only when asked.
"""

from __future__ import annotations

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
from .config import with_newer_axes  # noqa: E402
from .mode_charts import modes_time, replay_time  # noqa: E402
from .results import Sweep, SweepDirError, best_per_library, kernel_time_words, load  # noqa: E402

CONFIG = [c for c in CONFIG_COLUMNS if c not in ("impl", "B")]  # a panel's line: one configuration over B
MAX_PANELS = 6
FORMATS = ("png", "svg")


def libraries(ok: pd.DataFrame) -> Lines:
    """Each library at its fastest ok variant per configuration, labelled with how many it had."""
    ok = with_newer_axes(ok)  # a table of rows from before an axis: at its default
    ok = ok.assign(library=ok.library.fillna(ok.impl)) if "library" in ok else ok.assign(library=ok.impl)
    best = best_per_library(ok).assign(line=lambda t: t.library)
    variants = ok.groupby("library").impl.unique()
    names = sorted(variants.index)
    labels = {n: (n if variants[n][0] == n else f"{n} ({variants[n][0]})") if len(variants[n]) == 1
              else f"{n} (fastest of its {len(variants[n])} variants)" for n in names}
    return Lines(best, {n: cs.library_style(n) for n in names}, labels)


def variants(ok: pd.DataFrame, library: str) -> Lines:
    ok = with_newer_axes(ok)
    mine = ok[ok.library.fillna(ok.impl) == library] if "library" in ok else ok[ok.impl == library]
    names = sorted(mine.impl.unique())
    return Lines(mine.assign(line=mine.impl), {n: cs.variant_style(n) for n in names}, {n: n for n in names})


def _batch_panels(ok: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(shape + state dtype, rows) with at least two batches, at the shape's least slot padding and
    without padding rows; the most populated first."""
    base = ok[ok.pad_rows == 0]
    base = base[base.slot_pad == base.groupby(SHAPE)["slot_pad"].transform("min")]
    kinds = [*SHAPE, "state_dtype", "T", "checkpoints", "mode", "ring"]
    panels = [(key, rows) for key, rows in base.groupby(kinds) if rows.B.nunique() >= 2]
    panels.sort(key=lambda kr: -len(kr[1]))
    return panels[:MAX_PANELS]


def latency(lines: Lines, table, meta, *, what: str = "latency against batch", eager: bool = True, **_):
    panels = _batch_panels(lines.rows)
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), what, meta, table)
    for ax, (key, rows) in zip(axes, panels, strict=True):
        for name, r in rows.sort_values("B").groupby("line"):
            look = lines.styles[name]
            ax.fill_between(r.B, r.kernel_us_placement_min, r.kernel_us_placement_max, color=look["color"],
                            alpha=0.25, lw=0)
            ax.plot(r.B, r.kernel_us_mean, ms=3.5, **look)
            if eager:
                ax.plot(r.B, r.call_us_median, ":", color=look["color"], lw=1, alpha=0.8)
        cs.log_axis(ax)
        cs.count_axis(ax, rows.B.unique(), "batch B")
        ax.set_ylabel("µs")
        ax.set_title(cs.shape_label(key), fontsize=9)
    handles, labels = lines.legend(pd.concat([r for _, r in panels]).line.unique())
    handles.append(Line2D([], [], color="0.3", marker="o", ms=3.5))
    labels.append(f"kernel time ({kernel_time_words(meta)}; band: their min–max)")
    if eager:
        handles.append(Line2D([], [], color="0.3", ls=":", lw=1))
        labels.append("one eager call of the same variant (median)")
    cs.legend(fig, handles, labels)
    return fig


def bandwidth(lines: Lines, table, meta, **_):
    panels = _batch_panels(lines.rows)
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), "bandwidth against batch", meta, table)
    roof = meta["copy_bandwidth_Bps"] / 1e9
    for ax, (key, rows) in zip(axes, panels, strict=True):
        for name, r in rows.sort_values("B").groupby("line"):
            ax.plot(r.B, r.gbps, ms=3.5, **lines.styles[name])
        ax.axhline(roof, color="k", ls=":", lw=1.2)
        ax.set_ylim(0, roof * 1.08)
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
    panels = [(key, joined.merge(r[[*CONFIG, "B"]].drop_duplicates())) for key, r in _batch_panels(rows)]
    panels = [(key, r) for key, r in panels if not r.empty]
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), f"speedup over {baseline} (kernel time)", meta, table)
    base_color = lines.styles.get(baseline, {"color": "0.3"})["color"]
    for ax, (key, r_all) in zip(axes, panels, strict=True):
        for name, r in r_all.sort_values("B").groupby("line"):
            ax.plot(r.B, r.speedup, ms=3.5, **lines.styles[name])
        ax.axhline(1, color=base_color, ls=":", lw=1.2)
        cs.ratio_axis(ax, r_all.speedup)
        cs.count_axis(ax, r_all.B.unique(), "batch B")
        ax.set_ylabel(f"{baseline} time / time")
        ax.set_title(cs.shape_label(key), fontsize=9)
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
                          cols=2, width=0.62 * len(kv) + 1.6, height=0.5 * len(hvs) + 1.6)
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
                          meta, table)
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


def _token_panels(ok: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(state dtype, B, shape) with rows at several T, unpadded; T = 1 rows join both checkpoint kinds."""
    rows = ok[(ok.pad_rows == 0) & (ok.slot_pad == 0)]
    panels = [(key, r) for key, r in rows.groupby(["state_dtype", "B", *SHAPE]) if r["T"].nunique() >= 2]
    return panels[:2 * MAX_PANELS]


def _token_lines(rows: pd.DataFrame):
    """(line, (mode, checkpoints), rows over T) per line; T = 1 of the mode starts either checkpoint kind's."""
    for (name, mode, kind), r in rows[rows["T"] > 1].groupby(["line", "mode", "checkpoints"]):
        one = rows[(rows.line == name) & (rows["T"] == 1) & (rows["mode"] == mode)]
        yield name, (mode, kind), pd.concat([one, r]).sort_values("T")


def _tokens_chart(lines: Lines, table, meta, what: str, **_):
    panels = _token_panels(lines.rows)
    if not panels:
        return None
    title = f"speculative verify: {'kernel time' if what == 'time' else 'bandwidth'} against tokens per row"
    fig, axes = cs.figure(len(panels), title, meta, table, cols=4, width=4.2, height=3.4)
    roof = meta.get("copy_bandwidth_Bps", 0) / 1e9
    for ax, ((dtype, B, *shape), rows) in zip(axes, panels, strict=True):
        for name, kind, r in _token_lines(rows):
            look = lines.styles[name] | {"linestyle": cs.STORES[kind][0]}
            ax.plot(r["T"], r.kernel_us_mean if what == "time" else r.gbps, ms=3.5, **look)
        if what == "time":
            cs.log_axis(ax)
            ax.set_ylabel("µs per step")
        else:
            ax.axhline(roof, color="k", ls=":", lw=1.2)
            ax.set_ylim(0, roof * 1.08)
            ax.set_ylabel("GB/s (bytes moved / kernel time)")
        cs.count_axis(ax, rows["T"].unique(), "tokens per row T")
        H, HV, K, V = shape
        ax.set_title(f"B={B}, {dtypes.short(dtype)} state (H={H} HV={HV} K={K} V={V})", fontsize=9)
    drawn = pd.concat([r for _, r in panels])
    handles, labels = cs.store_legend(*lines.legend(drawn.line.unique()), drawn)
    if what != "time":
        handles.append(Line2D([], [], color="k", ls=":", lw=1.2))
        labels.append(f"measured device copy: {roof:,.4g} GB/s")
    cs.legend(fig, handles, labels)
    return fig


CHARTS = {"latency": latency, "bandwidth": bandwidth, "speedup": speedup, "heatmap": heatmap,
          "slot_padding": slot_padding, "tokens_time": partial(_tokens_chart, what="time"),
          "tokens_bandwidth": partial(_tokens_chart, what="bandwidth"), "modes_time": modes_time,
          "replay_time": replay_time}


def figures(ok: pd.DataFrame, table: pd.DataFrame, meta: dict, *, baseline=None, batch=None):
    """(name, figure) of every chart the rows allow: the library charts, then each library's variants."""
    ok = with_newer_axes(ok)
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
    known = set(sweep.table.impl) | set(sweep.table.get("library", pd.Series(dtype=str)).dropna())
    if baseline is not None and baseline not in known:
        raise ValueError(f"--baseline {baseline} is not in {sweep.path} (its libraries and implementations: "
                         f"{', '.join(sorted(known))})")


def plot_dir(sweep_dir: Path, *, baseline: str | None = None, batch: int | None = None,
             out: Path | None = None, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Draw every chart the directory's rows allow into ``out`` (default: the sweep's own directory), in
    ``formats``; return the files written."""
    sweep = load(sweep_dir)
    check_baseline(sweep, baseline)
    out = Path(out) if out is not None else sweep.path
    written = []
    for name, fig in figures(sweep.ok, sweep.table, sweep.meta, baseline=baseline, batch=batch):
        if fig is None:
            continue
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            fig.savefig(path, dpi=130)
            written.append(path)
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


def chart_dir(sweep_dir: Path, out: Path | None) -> tuple[Path, str | None]:
    """(where the charts go, a line saying why when it is not where the user would look): ``out``; else the
    sweep's own directory when git does not track it; else a new directory."""
    if out is not None:
        return out, None
    if not tracked_by_git(sweep_dir):
        return sweep_dir, None
    new = Path(tempfile.mkdtemp(prefix=f"kda-plot-{sweep_dir.resolve().name}-"))
    return new, f"{sweep_dir} is tracked by git, so its charts are left as they are: new charts in {new} (--out DIR)"


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="kda-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="a sweep directory (results.csv, meta.json)")
    parser.add_argument("--out", type=Path, help="where the charts go (default: DIR when git does not track it, "
                                                 "else a new directory)")
    parser.add_argument("--baseline", help="the speedup chart's denominator: a library or an implementation "
                                           "(default: flashinfer if present, else naive)")
    parser.add_argument("--batch", type=int, help="the heatmap's batch (default: the batch with the most shapes)")
    parser.add_argument("--format", type=comma_list(str), default=FORMATS,
                        help=f"file formats, comma-separated (default: {','.join(FORMATS)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.format) - set(plt.gcf().canvas.get_supported_filetypes()))
    plt.close("all")
    if unknown:
        parser.error(f"--format: {', '.join(unknown)} is not a format matplotlib writes")
    try:
        check_baseline(load(args.dir), args.baseline)  # a bad directory or baseline: before anything is made
    except (SweepDirError, ValueError) as exc:
        fail("kda-plot", str(exc))
    out, note = chart_dir(args.dir, args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # a probe, so that no chart half-draws into a read-only place
            pass
    except OSError as exc:
        fail("kda-plot", f"cannot write charts in {out}: {exc.strerror}; give a writable directory with --out DIR")
    if note:
        print(note)
    try:
        written = plot_dir(args.dir, baseline=args.baseline, batch=args.batch, out=out, formats=args.format)
    except OSError as exc:
        fail("kda-plot", f"cannot write charts in {out}: {exc.strerror}")
    for path in written:
        print(path)
    if not written:
        print(f"no chart: {args.dir} has too few ok rows to draw")
