"""scripts/targets.py: the Triton targets judged on a results table, and README's generated block."""

from pathlib import Path

import pandas as pd

from helpers import load_script

targets = load_script("targets")


def row(impl, B, us, frac, state="bfloat16", slot_pad=0, spread=0.01):
    return dict(impl=impl, B=B, H=32, HV=32, K=128, V=128, slot_pad=slot_pad, state_dtype=state, status="ok",
                kernel_us_median=us, kernel_us_p25=us * (1 - spread), kernel_us_p75=us * (1 + spread),
                roofline_frac=frac)


def table():
    return pd.DataFrame([
        row("triton", 1, 2.6, 0.2), row("flashinfer", 1, 2.5, 0.2, spread=0.05),  # IQRs overlap: within noise
        row("triton", 16, 10.0, 0.8), row("flashinfer", 16, 12.0, 0.7),            # 1.2x: met
        row("triton", 64, 36.0, 0.91), row("flashinfer", 64, 40.0, 0.8),            # 1.11x: missed
        row("triton", 64, 36.5, 0.9, slot_pad=64),                                  # +1.4%: met
        row("triton", 256, 150.0, 0.85), row("triton", 256, 160.0, 0.8, slot_pad=64),  # +6.7%: missed
    ])


def test_targets_are_judged():
    sections, summary = targets.judge(table(), "triton", "flashinfer")
    assert summary == {"bandwidth": "1/2 met", "speedup": "2/3 met", "padding": "1/2 met"}
    speedup = next(s for s in sections if s.startswith("## Speed-up"))
    assert "| bfloat16      |   32 | 128 | 128 |   1 |" in speedup


def test_readme_block_is_replaced(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{targets.README_BEGIN}\nstale\n{targets.README_END}\noutro\n")
    targets.write_readme_table(readme, table(), Path("results/x"))
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "stale" not in text
    assert "triton bf16" in text and "2.60 us (20%)" in text
