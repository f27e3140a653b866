"""Charts: each library at its best verified call in one colour, each library's variants in a chart of their own,
at least two labelled ticks on every log axis, legends inside the figure, a panel for every configuration on one
shared y axis, what is not drawn named in the title; where kda-plot writes (never into a directory git tracks
unless asked), whole files carrying the chart code's version, and its one-line errors; the committed charts drawn
by today's chart code. Tiny frames, the Agg backend."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from kda_impls.bench import chart_style, plots

REPO = Path(__file__).resolve().parents[1]
META = {"device": {"name": "Test GPU", "type": "cuda", "compute_capability": "9.0"}, "copy_bandwidth_Bps": 4e12,
        "versions": {"torch": "2.11"}, "settings": {"method": {"entry": "previous-step", "version": 4}}}
# kernel us per (impl, B); fla-batched wins at B = 16 only, so fla's best line takes one point from each
TIMES = {("fla", 1): 4.0, ("fla", 4): 9.0, ("fla", 16): 30.0, ("fla-batched", 1): 5.0, ("fla-batched", 4): 9.5,
         ("fla-batched", 16): 25.0, ("triton", 1): 3.0, ("triton", 4): 6.0, ("triton", 16): 20.0,
         ("naive", 1): 60.0, ("naive", 4): 70.0, ("naive", 16): 90.0}
LIBRARY = {"fla": "fla", "fla-batched": "fla", "triton": "kda-impls", "naive": "torch"}


def table(state_dtypes=("bfloat16", "float32")) -> pd.DataFrame:
    rows = []
    for (impl, B), us in TIMES.items():
        for dtype in state_dtypes:
            rows.append({"impl": impl, "library": LIBRARY[impl], "B": B, "H": 4, "HV": 4, "K": 16, "V": 16,
                         "state_dtype": dtype, "pad_rows": 0, "T": 1, "checkpoints": "all", "mode": "inplace",
                         "ring": 0, "slot_pad": 0, "slots_per_row": 1, "slot_order": "random", "placements": 3,
                         "status": "ok", "key": f"{impl}_{B}_{dtype}", "kernel_us_mean": us,
                         "kernel_us_placement_min": us * 0.98, "kernel_us_placement_max": us * 1.02,
                         "call_us_median": us + 40, "gbps": 1e3 / us, "roofline_frac": 0.25 / us})
    return pd.DataFrame(rows)


def sweep_dir(path: Path) -> Path:
    """A sweep directory of one state dtype: one panel a chart, cheap to draw."""
    path.mkdir(parents=True)
    table(("bfloat16",)).to_csv(path / "results.csv", index=False)
    (path / "meta.json").write_text(pd.Series(META).to_json())
    return path


@pytest.fixture(scope="module")
def figures():
    frame = table()
    drawn = dict(plots.figures(frame, frame, META))
    yield {name: fig for name, fig in drawn.items() if fig is not None}
    plt.close("all")


def test_frozen_verify_and_in_place_share_a_panel_per_shape_and_tokens():
    """modes_time: one panel per (shape, state dtype, T) where both modes ran, a line per library and
    mode in the library's colour (dotted: frozen verify; dashed: in place storing the last state)."""
    frame = table(("bfloat16",))
    frame = frame[frame.impl.isin(["triton", "naive"])].assign(T=4, checkpoints="last")
    frozen = frame.assign(mode="frozen", checkpoints="all", kernel_us_mean=frame.kernel_us_mean / 2)
    both = pd.concat([frame, frozen, frozen.assign(T=1)], ignore_index=True)  # T = 1: frozen alone, no panel
    fig = plots.modes_time(plots.libraries(both), both, META)
    (ax,) = [ax for ax in fig.axes if ax.get_lines()]
    assert ax.get_title().startswith("T=4, bf16 state")
    drawn = {(to_hex(line.get_color()), line.get_linestyle()): list(line.get_ydata()) for line in ax.get_lines()}
    triton = to_hex(chart_style.library_style("kda-impls")["color"])
    assert drawn[triton, ":"] == [TIMES["triton", b] / 2 for b in (1, 4, 16)]
    assert drawn[triton, "--"] == [TIMES["triton", b] for b in (1, 4, 16)] and len(drawn) == 4
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "frozen verify, nothing stored" in labels and "in place, after the last token only" in labels
    assert plots.modes_time(plots.libraries(frame), frame, META) is None  # one mode: no chart
    plt.close(fig)


def lines_of(ax) -> dict[str, object]:
    return {line.get_color(): line for line in ax.get_lines() if line.get_linestyle() == "-"}


def test_each_library_is_one_line_at_its_fastest_variant(figures):
    ax = figures["latency"].axes[0]
    colors = {to_hex(c) for c in lines_of(ax)}
    assert colors == {chart_style.library_style(lib)["color"] for lib in ("fla", "kda-impls", "torch")}
    fla = lines_of(ax)[chart_style.library_style("fla")["color"]]
    assert list(fla.get_ydata()) == [4.0, 9.0, 25.0]  # the pointwise fastest of fla and fla-batched
    labels = [t.get_text() for t in figures["latency"].legends[0].get_texts()]
    assert "fla (fastest of its 2 variants)" in labels and "kda-impls (triton)" in labels


def test_a_library_with_variants_gets_its_own_chart_in_distinct_colours(figures):
    assert "variants_fla" in figures and "variants_kda-impls" not in figures and "variants_torch" not in figures
    ax = figures["variants_fla"].axes[0]
    assert len(lines_of(ax)) == 2
    assert [t.get_text() for t in figures["variants_fla"].legends[0].get_texts()][:2] == ["fla", "fla-batched"]


def test_every_log_axis_has_two_labelled_ticks_and_every_legend_fits(figures):
    checked = 0
    for name, fig in figures.items():
        fig.canvas.draw()
        box = fig.bbox
        for legend in fig.legends:
            extent = legend.get_window_extent()
            assert extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1 and extent.y0 >= box.y0 - 1, name
        for ax in fig.axes:
            for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
                if axis.get_scale() != "log":
                    continue
                ticks = [t for t in axis.get_majorticklocs() if min(lo, hi) <= t <= max(lo, hi)]
                labels = [t for t in axis.get_ticklabels(which="both") if t.get_text()
                          and min(lo, hi) <= t.get_position()[axis is ax.yaxis] <= max(lo, hi)]
                assert len(ticks) >= 2 and len(labels) >= 2, (name, axis.axis_name, lo, hi)
                checked += 1
    assert checked >= 6


@pytest.mark.parametrize("lo, hi", [(8.0, 90.0), (3.1, 3.9), (12.0, 19.0), (2.0, 3000.0), (0.4, 0.6)])
def test_log_ticks_are_two_or_more_within_any_span(lo, hi):
    ticks = chart_style.log_ticks(lo, hi)
    assert len(ticks) >= 2 and all(lo <= t <= hi for t in ticks)


def run_main(capsys, *argv) -> tuple[int, str, str]:
    try:
        plots.main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def kda_plot_temporaries() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("kda-plot-*"))


def test_charts_go_beside_an_untracked_sweep_and_not_into_a_tracked_one(tmp_path, capsys):
    """Beside an untracked sweep: every file whole (no temporary left) and stamped with the chart code's
    version. A tracked one: refused in one line naming --out, nothing written anywhere (nor in the
    temporary directory); --out chooses where, the tracked directory itself included."""
    temporaries = kda_plot_temporaries()
    own = sweep_dir(tmp_path / "own")
    code, out, _ = run_main(capsys, str(own), "--format", "png,svg")
    assert code == 0 and (own / "latency.png").exists() and (own / "variants_fla.svg").exists()
    charts = [p for p in own.iterdir() if p.suffix in (".png", ".svg")]
    assert sorted(p.name for p in own.iterdir()) == sorted(["results.csv", "meta.json", *(p.name for p in charts)])
    assert {chart_style.stamped_version(p) for p in charts} == {chart_style.CHART_VERSION}
    assert out.splitlines() == [str(p) for p in sorted(charts, key=lambda p: out.index(p.name))]
    repo = tmp_path / "repo"
    tracked = sweep_dir(repo / "results" / "run")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "run"], check=True)
    before = sorted(p.name for p in tracked.iterdir())
    code, out, err = run_main(capsys, str(tracked), "--format", "png")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "is tracked by git" in err and f"--out {tracked} rewrites them" in err
    assert sorted(p.name for p in tracked.iterdir()) == before and kda_plot_temporaries() == temporaries
    chosen = tmp_path / "chosen"
    assert run_main(capsys, str(tracked), "--out", str(chosen), "--format", "svg")[0] == 0
    assert (chosen / "speedup.svg").exists() and not list(chosen.glob("*.png"))
    assert run_main(capsys, str(tracked), "--out", str(tracked), "--format", "svg")[0] == 0
    assert (tracked / "latency.svg").exists()


def test_an_unwritable_place_is_one_line_and_exit_2(tmp_path, capsys):
    sweep = sweep_dir(tmp_path / "run")
    code, _, err = run_main(capsys, str(sweep), "--out", "/proc/kda-plot-charts")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot write charts in /proc/kda-plot-charts" in err
    for formats, wrong in (("png,bmpx", "bmpx"), ("jpg", "jpg")):  # jpg: matplotlib writes it, without the stamp
        code, _, err = run_main(capsys, str(sweep), "--format", formats)
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"{wrong} is not a format kda-plot writes" in err
    code, out, err = run_main(capsys, str(sweep), "--batch", "999")
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert "--batch 999: " in err and "no ok rows at that batch (its batches: 1, 4, 16)" in err
    if os.geteuid() != 0:  # root writes into read-only modes: only an unprivileged user can see this one
        sweep.chmod(0o555)
        code, _, err = run_main(capsys, str(sweep))
        sweep.chmod(0o755)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot write charts in" in err
    assert not list(sweep.glob("*.png"))


def test_kda_plot_draws_from_a_checkout(tmp_path):
    sweep = sweep_dir(tmp_path / "run")
    command = [sys.executable, "-m", "kda_impls.bench.plots", str(sweep), "--out", str(tmp_path / "charts"),
               "--baseline", "fla", "--format", "png"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path,
                          env=os.environ | {"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "charts" / "speedup.png").exists()


def configurations(n: int) -> pd.DataFrame:
    """``n`` configurations (head dims) of three batches each, one more at a single batch, and a row
    with padding rows (which no batch chart draws)."""
    frame = table(("bfloat16",))
    frame = frame[frame.impl.isin(["triton", "naive"])]
    parts = [frame.assign(K=16 * (i + 1), V=16 * (i + 1), key=frame.key + f"_{i}") for i in range(n)]
    lone = frame[frame.B == 1].assign(K=999, V=999, key=frame.key + "_lone")
    padded = frame[frame.B == 1].assign(pad_rows=1, key=frame.key + "_pad")
    return pd.concat([*parts, lone, padded], ignore_index=True)


def test_every_configuration_gets_a_panel_on_one_y_axis_and_the_title_names_what_is_left_out():
    """Nine configurations, one at a single batch: nine panels in the latency, bandwidth and speedup
    charts (none dropped), every panel on the same y axis (same limits), and the title counting the
    ok rows no panel draws, with why."""
    frame = configurations(8)
    bad = frame.iloc[:1].assign(status="wrong", key="broken")
    drawn = dict(plots.figures(frame, pd.concat([frame, bad]), META))
    for name in ("latency", "bandwidth", "speedup"):
        fig = drawn[name]
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_lines()]
        assert len(panels) == 9, name
        assert len({ax.get_ylim() for ax in panels}) == 1, name
        assert all(panels[0].get_shared_y_axes().joined(panels[0], ax) for ax in panels), name
        text = fig._suptitle.get_text().replace("\n", " ")
        assert "not drawn: 1 wrong rows, 2 ok rows with padding rows" in text, text
        plt.close(fig)
    plt.close("all")


def test_a_bandwidth_above_the_copy_roofline_stays_in_view():
    frame = table(("bfloat16",)).assign(gbps=lambda t: t.gbps * 10)  # 10x: above the 4000 GB/s copy at B = 1
    fig = plots.bandwidth(plots.libraries(frame), frame, META)
    (ax,) = [ax for ax in fig.axes if ax.get_lines()]
    assert ax.get_ylim()[1] >= frame.gbps.max()
    plt.close(fig)


COMMITTED = sorted(p for p in (REPO / "results").rglob("*") if p.suffix in (".png", ".svg", ".pdf"))


@pytest.mark.parametrize("chart", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_a_committed_chart_is_drawn_by_todays_chart_code(chart):
    """Every chart under results/ carries the version of the chart code that drew it, and that is
    today's: a change to the chart code redraws the committed charts from their data
    (`kda-plot DIR --out DIR --format FORMAT`, results/README.md)."""
    assert chart_style.stamped_version(chart) == chart_style.CHART_VERSION, \
        f"{chart.relative_to(REPO)} was drawn by other chart code: kda-plot {chart.parent.relative_to(REPO)} " \
        f"--out {chart.parent.relative_to(REPO)} --format {chart.suffix[1:]}"
