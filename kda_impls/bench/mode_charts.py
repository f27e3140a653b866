"""The charts of :mod:`.plots` that set the modes of a step side by side:

- tokens_time, tokens_bandwidth: speculative verify, kernel time and bandwidth against the tokens per row T
  (solid: the state stored after every token; dashed: after the last only; dotted: frozen verify);
- modes_time: frozen verify against in-place decode of the same T tokens, kernel time per step against
  batch, a line per library and mode in the library's colour (the line style says the mode and what is stored);
- replay_time: cached-input replay against in-place decode (T = 1), kernel time per step against batch,
  a colour per mode (in place, replay at each ring length), a marker per library; a replay row's time is
  its mean over whole ring cycles, flush included.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.lines import Line2D

from .. import dtypes
from . import chart_style as cs
from .chart_style import SHAPE, Lines

INPLACE_COLOR = "0.25"


def _unpadded(lines: Lines) -> pd.DataFrame:
    return lines.rows[(lines.rows.pad_rows == 0) & (lines.rows.slot_pad == 0)]


def modes_time(lines: Lines, table, meta, **_):
    """Per (shape, state dtype, T) with both modes at two batches or more, unpadded: a line per library and mode."""
    rows = _unpadded(lines)
    rows = rows[rows["mode"] != "replay"]
    panels = [(key, r) for key, r in rows.groupby([*SHAPE, "state_dtype", "T"])
              if r["mode"].nunique() == 2 and r.B.nunique() >= 2]
    if not panels:
        return None
    fig, axes = cs.figure(len(panels), "frozen verify against in-place decode: kernel time per step against batch",
                          meta, table, cols=4, width=4.2, height=3.4,
                          left_out=cs.left_out(lines.rows, panels, "padded, replay, or without both modes"
                                               " at two batches"))
    for ax, ((H, HV, K, V, dtype, T), r) in zip(axes, panels, strict=True):
        for (name, mode, kind), line in r.sort_values("B").groupby(["line", "mode", "checkpoints"]):
            ax.plot(line.B, line.kernel_us_mean, ms=3.5, **lines.styles[name] | {"linestyle": cs.STORES[mode, kind][0]})
        _batch_axes(ax, r, f"T={T}, {dtypes.short(dtype)} state (H={H} HV={HV} K={K} V={V})")
    cs.log_axis(axes[0])  # shared: its limits and ticks hold every panel's data
    drawn = pd.concat([r for _, r in panels])
    cs.legend(fig, *cs.store_legend(*lines.legend(drawn.line.unique()), drawn))
    return fig


def replay_time(lines: Lines, table, meta, **_):
    """Per (shape, state dtype) with replay and in-place rows of one token at two batches or more, unpadded:
    a line per library, mode and ring."""
    rows = _unpadded(lines)
    rows = rows[(rows["T"] == 1) & rows["mode"].isin(["inplace", "replay"])]
    panels = [(key, r) for key, r in rows.groupby([*SHAPE, "state_dtype"])
              if r["mode"].nunique() == 2 and r.B.nunique() >= 2]
    if not panels:
        return None
    rings = sorted(pd.concat([r for _, r in panels]).query("mode == 'replay'").ring.unique())
    colors = {0: INPLACE_COLOR} | dict(zip(rings, cs.plasma(len(rings)), strict=True))
    fig, axes = cs.figure(len(panels), "replay against in-place decode: time per step over whole ring cycles",
                          meta, table, cols=4, width=4.2, height=3.4,
                          left_out=cs.left_out(lines.rows, panels, "padded, frozen, or without both modes"
                                               " at two batches"))
    for ax, ((H, HV, K, V, dtype), r) in zip(axes, panels, strict=True):
        for (name, ring), line in r.sort_values("B").groupby(["line", "ring"]):
            ax.plot(line.B, line.kernel_us_mean, ms=3.5, **lines.styles[name] | {"color": colors[ring]})
        _batch_axes(ax, r, f"{dtypes.short(dtype)} state (H={H} HV={HV} K={K} V={V})")
    cs.log_axis(axes[0])  # shared: its limits and ticks hold every panel's data
    drawn = pd.concat([r for _, r in panels])
    names = [n for n in lines.styles if n in set(drawn.line)]
    handles = [Line2D([], [], color="0.5", marker=lines.styles[n]["marker"], ms=3.5) for n in names]
    handles += [Line2D([], [], color=colors[ring], lw=2) for ring in colors]
    labels = [lines.labels[n] for n in names] + ["in place"] + [f"replay, a ring of {ring} records" for ring in rings]
    cs.legend(fig, handles, labels)
    return fig


def _batch_axes(ax, rows: pd.DataFrame, title: str) -> None:
    cs.count_axis(ax, rows.B.unique(), "batch B")
    ax.set_ylabel("µs per step")
    ax.set_title(title, fontsize=9)


def _token_panels(ok: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(state dtype, B, shape) with rows at several T, unpadded; T = 1 rows join both checkpoint kinds."""
    rows = ok[(ok.pad_rows == 0) & (ok.slot_pad == 0)]
    return [(key, r) for key, r in rows.groupby(["state_dtype", "B", *SHAPE]) if r["T"].nunique() >= 2]


def _token_lines(rows: pd.DataFrame):
    """(line, (mode, checkpoints), rows over T) per line; T = 1 of the mode starts either checkpoint kind's."""
    for (name, mode, kind), r in rows[rows["T"] > 1].groupby(["line", "mode", "checkpoints"]):
        one = rows[(rows.line == name) & (rows["T"] == 1) & (rows["mode"] == mode)]
        yield name, (mode, kind), pd.concat([one, r]).sort_values("T")


def tokens_chart(lines: Lines, table, meta, what: str, **_):
    panels = _token_panels(lines.rows)
    if not panels:
        return None
    title = f"speculative verify: {'kernel time' if what == 'time' else 'bandwidth'} against tokens per row"
    fig, axes = cs.figure(len(panels), title, meta, table, cols=4, width=4.2, height=3.4,
                          left_out=cs.left_out(lines.rows, panels, "padded or at one T"))
    roof = meta.get("copy_bandwidth_Bps", 0) / 1e9
    top = max(roof, *(r.gbps.max() for _, r in panels)) * 1.08
    for ax, ((dtype, B, *shape), rows) in zip(axes, panels, strict=True):
        for name, kind, r in _token_lines(rows):
            look = lines.styles[name] | {"linestyle": cs.STORES[kind][0]}
            ax.plot(r["T"], r.kernel_us_mean if what == "time" else r.gbps, ms=3.5, **look)
        if what == "time":
            ax.set_ylabel("µs per step")
        else:
            ax.axhline(roof, color="k", ls=":", lw=1.2)
            ax.set_ylim(0, top)
            ax.set_ylabel("GB/s (bytes moved / kernel time)")
        cs.count_axis(ax, rows["T"].unique(), "tokens per row T")
        H, HV, K, V = shape
        ax.set_title(f"B={B}, {dtypes.short(dtype)} state (H={H} HV={HV} K={K} V={V})", fontsize=9)
    if what == "time":
        cs.log_axis(axes[0])  # shared: its limits and ticks hold every panel's data
    drawn = pd.concat([r for _, r in panels])
    handles, labels = cs.store_legend(*lines.legend(drawn.line.unique()), drawn)
    if what != "time":
        handles.append(Line2D([], [], color="k", ls=":", lw=1.2))
        labels.append(f"measured device copy: {roof:,.4g} GB/s")
    cs.legend(fig, handles, labels)
    return fig
