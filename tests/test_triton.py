"""Our Triton KDA decode kernel against the float64 reference.

Small shapes run wherever the kernel can: on the GPU when there is one, else on the CPU under
TRITON_INTERPRET=1 (tests/conftest.py sets it before any kernel module is imported). The tests
marked ``gpu`` are the H200 grid, CUDA-graph capture and the config override on real hardware.
Every check goes through kda_impls.verify: output poisoned with NaN, state and output against the
reference, untouched slots and the padding between slots compared bit for bit.
"""

import functools
import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from helpers import (
    DEVICE,
    REPO,
    assert_graph_replay_takes_eager_step,
    assert_launch_allocates_nothing,
    runnable,
)
from kda_impls import get, make_inputs, reference, rel_err, verify
from kda_impls.impls.triton.inplace import _kda_decode_persistent_kernel
from kda_impls.impls.triton.kernel import TritonKDA, launches, multiprocessors
from kda_impls.impls.triton.tiles import CONFIG_ENV, TileConfig, choose_config, heuristic_config, table_key
from kda_impls.impls.triton.tuning import TABLE

gpu = pytest.mark.gpu
pytestmark = pytest.mark.usefixtures("no_config_override")

SMALL_CASES = {
    "gva-k<v-padded": dict(B=4, H=2, HV=4, K=32, V=64, slot_pad=16, pad_rows=1),
    "k>v-odd-pad": dict(B=3, H=2, HV=2, K=64, V=16, slot_pad=7, pad_rows=1, n_slots=9),
    "tiny-heads-grouped": dict(B=4, H=1, HV=8, K=16, V=16, slot_pad=3, n_slots=6),
    "all-rows-padding": dict(B=2, H=1, HV=2, K=16, V=32, pad_rows=2),
    "one-row-one-slot": dict(B=1, H=1, HV=2, K=32, V=32, n_slots=1),
    "largest-k": dict(B=2, H=1, HV=2, K=256, V=64, slot_pad=16, pad_rows=1),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", SMALL_CASES.values(), ids=SMALL_CASES.keys())
def test_matches_reference(case, state_dtype):
    inputs = runnable(make_inputs(**case, state_dtype=state_dtype, device=DEVICE, seed=5))
    verdict = verify(get("triton"), inputs)
    assert verdict.ok, verdict


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_activation_and_fp16_state_dtypes(dtype):
    inputs = runnable(make_inputs(3, 2, 4, 32, 16, state_dtype=torch.float16, dtype=dtype, slot_pad=8, pad_rows=1,
                                  device=DEVICE, seed=9))
    verdict = verify(get("triton"), inputs)
    assert verdict.ok, verdict


@pytest.mark.interpreter
def test_fp32_everything_is_fp32_accurate():
    inputs = runnable(make_inputs(4, 2, 4, 64, 32, state_dtype=torch.float32, dtype=torch.float32, slot_pad=16,
                                  pad_rows=1, device=DEVICE, seed=2))
    verdict = verify(get("triton"), inputs)
    assert verdict.ok, verdict
    assert verdict.err_out <= 1e-5 and verdict.err_state <= 1e-5, verdict


# Every way the program mapping can cut a step: several V-tiles, one tile a head, a tile taller than V,
# sub-tiles, more sub-tiles than V holds.
FORCED = [
    TileConfig(BV=8, num_warps=1),
    TileConfig(BV=32, num_warps=4),
    TileConfig(BV=256, num_warps=8),
    TileConfig(BV=8, num_warps=1, subtiles=2),
    TileConfig(BV=4, num_warps=1, subtiles=8),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("config", FORCED, ids=str)
def test_forced_tile_configs(config):
    inputs = runnable(make_inputs(3, 3, 6, 16, 32, state_dtype=torch.bfloat16, slot_pad=16, pad_rows=1,
                                  device=DEVICE, seed=13))
    verdict = verify(TritonKDA(config), inputs, steps=1)  # the mapping, not compounding: the forms grid's
    assert verdict.ok, verdict


# Each form of the one-token step, in bf16 and fp32 state (form_runs() says on which cases): the head counts
# compiled in (alone and with sub-tiles; every other config passes them at run time), the state loaded
# before the small inputs (alone and with sub-tiles; every other one-tile config loads it after them),
# sub-tiles (two per program; more than V holds, fitted to V), the persistent grid (one program walking
# every tile, so each look-ahead crosses rows, heads and V-tiles; three programs, a tail; more programs
# than tiles), the stored tile widened twice (alone; with sub-tiles), the state loaded between the small
# inputs' loads and the gate (alone and with sub-tiles), the persistent grid with only the slots looked
# ahead (one program walking every tile; three programs), the state's accesses without eviction hints
# (one program per tile, persistent), the gate in base 2 (one program per tile, with sub-tiles,
# persistent; the interpreter's log2 is tl.log2's), and the small inputs loaded as tiles of copies (in
# base 2, the state between them and the gate, widened twice; with the libdevice gate and sub-tiles;
# the state after the gate).
FORMS = [
    TileConfig(BV=8, num_warps=1, const_heads=1),
    TileConfig(BV=8, num_warps=1, state_first=1),
    TileConfig(BV=4, num_warps=1, subtiles=2, const_heads=1),
    TileConfig(BV=8, num_warps=1, subtiles=2),
    TileConfig(BV=16, subtiles=64),
    TileConfig(BV=8, num_warps=1, programs_per_sm=1),
    TileConfig(BV=16, num_warps=2, programs_per_sm=3),
    TileConfig(BV=4, num_warps=1, programs_per_sm=64),
    TileConfig(BV=8, num_warps=1, rewiden=1),
    TileConfig(BV=8, num_warps=1, state_first=2),
    TileConfig(BV=4, num_warps=1, subtiles=2, state_first=2),
    TileConfig(BV=4, num_warps=1, subtiles=2, state_first=1, rewiden=1),
    TileConfig(BV=8, num_warps=1, programs_per_sm=1, lookahead=0),
    TileConfig(BV=16, num_warps=2, programs_per_sm=3, lookahead=0),
    TileConfig(BV=8, num_warps=1, load_evict_first=0, store_evict_first=0),
    TileConfig(BV=8, num_warps=1, programs_per_sm=3, load_evict_first=0, store_evict_first=0),
    TileConfig(BV=4, num_warps=1, const_heads=1, state_first=1, fast_gate=1),
    TileConfig(BV=4, num_warps=1, subtiles=2, rewiden=1, fast_gate=1),
    TileConfig(BV=8, num_warps=1, programs_per_sm=3, fast_gate=1),
    TileConfig(BV=4, num_warps=1, const_heads=1, state_first=2, rewiden=1, fast_gate=1, tiled_inputs=1),
    TileConfig(BV=4, num_warps=1, subtiles=2, tiled_inputs=1),
    TileConfig(BV=8, num_warps=1, tiled_inputs=1),
    TileConfig(BV=16, num_warps=4, const_heads=1, state_first=1, rewiden=1, fast_gate=1, tiled_inputs=1),
]


# The cases the forms run on, at their smallest: every form on the first two, the state dtype alternating
# (each form once in bf16, once in fp32). The first has GVA with two q/k heads (a wrong head mapping reads
# the other one), K < V, padded slots TMA can address, a -1 row, untouched slots, and tile counts a
# three-program grid leaves a tail of; the second K > V, H = HV, a slot pad TMA cannot address (the TMA
# forms run as pointers), two live rows and a -1 row, fewer tiles than 64 programs.
FORM_CASES = {
    "gva-k<v-padded": dict(B=2, H=2, HV=4, K=16, V=32, slot_pad=8, pad_rows=1),
    "k>v-odd-pad": dict(B=3, H=2, HV=2, K=32, V=16, slot_pad=7, pad_rows=1, n_slots=9),
    "tiny-heads-grouped": dict(B=2, H=1, HV=8, K=16, V=16, slot_pad=3, n_slots=6),
    "all-rows-padding": SMALL_CASES["all-rows-padding"],
    "one-row-one-slot": SMALL_CASES["one-row-one-slot"],
    "largest-k": dict(B=2, H=1, HV=2, K=256, V=32, slot_pad=16, pad_rows=1),
}
# The forms whose change meets what one of the other cases has: the head counts compiled in and
# runtime in a GVA group of 8; the persistent walks and the inputs as tiles on rows all -1; the
# persistent grid on a pool of one slot; the small inputs as tiles, sub-tiles and the twice-widened
# store at K = 256.
FORM_INTERACTIONS = {
    "tiny-heads-grouped": [FORMS[0], FORMS[1], FORMS[2], FORMS[11]],
    "all-rows-padding": [FORMS[5], FORMS[12], FORMS[21]],
    "one-row-one-slot": [FORMS[7]],
    "largest-k": [FORMS[3], FORMS[8], FORMS[19], FORMS[21]],
}


# The forms that store the state by a path of their own, run over verify's default steps on the first
# case (an error of the form that compounds from step to step): sub-tiles, the persistent grid, the
# tile widened twice, the base-2 gate, the small inputs as tiles. Every other run takes one step
# (the default config's steps: test_matches_reference).
MULTI_STEP = [FORMS[3], FORMS[5], FORMS[8], FORMS[18], FORMS[21]]


def form_runs() -> list:
    """(case, state dtype, form, steps): every form on the first two cases, the forms of
    FORM_INTERACTIONS on theirs."""
    dtypes = [("bf16", torch.bfloat16), ("fp32", torch.float32)]
    main, other = list(FORM_CASES)[:2]
    runs = [(main, i % 2, config, None if config in MULTI_STEP else 1) for i, config in enumerate(FORMS)]
    runs += [(other, (i + 1) % 2, config, 1) for i, config in enumerate(FORMS)]
    runs += [(name, i % 2, config, 1) for name, configs in FORM_INTERACTIONS.items()
             for i, config in enumerate(configs)]
    return [pytest.param(FORM_CASES[name], dtypes[d][1], config, steps, id=f"{name}-{dtypes[d][0]}-{config}")
            for name, d, config, steps in runs]


@pytest.mark.interpreter
@pytest.mark.parametrize("case, state_dtype, config, steps", form_runs())
def test_kernel_forms_match_reference(case, state_dtype, config, steps):
    inputs = runnable(make_inputs(**case, state_dtype=state_dtype, device=DEVICE, seed=21))
    verdict = verify(TritonKDA(config), inputs, steps=steps)
    assert verdict.ok, verdict


def test_forms_are_fitted_to_the_shape():
    subtiles = TileConfig(BV=8, num_warps=1, subtiles=16)
    runtime_heads = TileConfig(BV=8, num_warps=1)
    persistent = TileConfig(BV=8, num_warps=1, programs_per_sm=4)
    assert subtiles.fitted(32).subtiles == 4 and runtime_heads.fitted(32) == runtime_heads  # V = 32: four tiles
    # one-token forms: a multi-token step drops them, and its kernel compiles the head counts in
    assert subtiles.fitted(32, T=2) == replace(subtiles, subtiles=1, const_heads=1, state_first=1)
    assert runtime_heads.fitted(32, T=2) == replace(runtime_heads, const_heads=1, state_first=1)
    assert persistent.fitted(32, T=4) == replace(persistent, programs_per_sm=0, const_heads=1, state_first=1)
    # the persistent form walks whole tiles, its head counts compiled in
    assert persistent.fitted(32) == TileConfig(BV=8, num_warps=1, programs_per_sm=4, const_heads=1, state_first=1)
    assert replace(subtiles, programs_per_sm=2).fitted(32) == TileConfig(BV=8, num_warps=1, programs_per_sm=2,
                                                                        const_heads=1, state_first=1)
    assert replace(runtime_heads, const_heads=1).fitted(32).const_heads == 1
    # the state load's place is a one-tile, one-token choice: sub-tiles, the persistent form and
    # the multi-token kernel load the state first
    state_first = replace(runtime_heads, state_first=1)
    assert runtime_heads.state_first == 0 and state_first.fitted(32) == state_first
    assert runtime_heads.fitted(32, T=2).state_first == 1
    assert replace(runtime_heads, subtiles=2).fitted(32).state_first == 1
    assert replace(runtime_heads, subtiles=2, state_first=2).fitted(32).state_first == 2  # before the gate too
    assert replace(runtime_heads, programs_per_sm=2).fitted(32).state_first == 1
    # lookahead is the persistent form's alone: the default anywhere else
    slots_ahead = replace(runtime_heads, programs_per_sm=4, lookahead=0)
    assert slots_ahead.fitted(32).lookahead == 0
    assert replace(slots_ahead, programs_per_sm=0).fitted(32) == runtime_heads
    assert slots_ahead.fitted(32, T=2).lookahead == 1
    # the eviction hints hold in every form
    unhinted = replace(runtime_heads, load_evict_first=0, store_evict_first=0)
    for form in (unhinted, replace(unhinted, programs_per_sm=4), replace(unhinted, subtiles=2)):
        assert (form.fitted(32).load_evict_first, form.fitted(32).store_evict_first) == (0, 0)
        assert (form.fitted(32, T=2).load_evict_first, form.fitted(32, T=2).store_evict_first) == (0, 0)
    # the small inputs as tiles are the one-program-per-tile one-token kernel's alone
    tiled = replace(runtime_heads, tiled_inputs=1)
    assert tiled.fitted(32) == tiled and replace(tiled, subtiles=2).fitted(32).tiled_inputs == 1
    assert replace(tiled, programs_per_sm=4).fitted(32).tiled_inputs == 0
    assert tiled.fitted(32, T=2).tiled_inputs == 0


def the_launch(inputs, out, config):
    """The one launch of an in-place step: ``(kernel, grid, args, meta)``."""
    (launch,) = launches(inputs, out, config)
    return launch


def test_forms_shape_the_grid():
    inputs = make_inputs(3, 2, 4, 32, 32, state_dtype=torch.bfloat16, seed=1)
    out = torch.empty(3, 4, 32, dtype=inputs.v.dtype)
    _, grid, args, meta = the_launch(inputs, out, TileConfig(BV=8, num_warps=1, subtiles=4))
    assert grid == (3 * 4,) and meta["SUBTILES"] == 4  # a program per (row, head)
    assert args[-2:] == (4, 2) and (meta["HV_CONST"], meta["GROUP_CONST"]) == (0, 0)  # head counts at run time
    _, _, args, meta = the_launch(inputs, out, TileConfig(BV=8, num_warps=1, const_heads=1))
    assert args[-2:] == (4, 2) and (meta["HV_CONST"], meta["GROUP_CONST"]) == (4, 2)  # compiled in
    assert meta["STATE_FIRST"] == 0
    assert the_launch(inputs, out, TileConfig(BV=8, num_warps=1, state_first=1))[3]["STATE_FIRST"] == 1
    kernel, grid, args, _ = the_launch(inputs, out, TileConfig(BV=8, num_warps=1, programs_per_sm=5))
    assert kernel is _kda_decode_persistent_kernel and grid == (5 * multiprocessors(inputs.device),)
    assert args[-1] == 3 * 4 * 32 // 8  # n_tiles
    assert the_launch(inputs, out, TileConfig(BV=8, num_warps=1, programs_per_sm=5))[3]["LOOKAHEAD"] == 1
    slots_ahead = TileConfig(BV=8, num_warps=1, programs_per_sm=5, lookahead=0)
    assert the_launch(inputs, out, slots_ahead)[3]["LOOKAHEAD"] == 0
    _, grid, _, _ = the_launch(inputs, out, TileConfig(BV=8, num_warps=1, programs_per_sm=64))
    assert grid == (3 * 4 * 32 // 8,)  # never more programs than tiles
    # the eviction hints, per form
    for form, hints in ((TileConfig(BV=8, num_warps=1), ("evict_first", "evict_first")),
                        (TileConfig(BV=8, num_warps=1, load_evict_first=0), ("", "evict_first")),
                        (TileConfig(BV=8, num_warps=1, programs_per_sm=5, store_evict_first=0), ("evict_first", ""))):
        meta = the_launch(inputs, out, form)[3]
        assert (meta["LOAD_HINT"], meta["STORE_HINT"]) == hints, form
    multitoken = make_inputs(3, 2, 4, 32, 32, T=2, state_dtype=torch.bfloat16, seed=1)
    meta = the_launch(multitoken, torch.empty(multitoken.out_shape, dtype=multitoken.v.dtype),
                      TileConfig(BV=8, num_warps=1, store_evict_first=0).fitted(32, T=2))[3]
    assert (meta["LOAD_HINT"], meta["STORE_HINT"]) == ("evict_first", "")


@pytest.mark.interpreter
def test_slot_order_and_scale_are_honoured():
    inputs = runnable(make_inputs(4, 1, 2, 16, 16, state_dtype=torch.float32, n_slots=8, device=DEVICE, seed=4))
    inputs.slots = torch.tensor([7, 0, 5, 2], dtype=torch.int32, device=DEVICE)  # descending, gaps
    inputs.scale = 0.3
    verdict = verify(get("triton"), inputs)
    assert verdict.ok, verdict


@pytest.mark.interpreter
def test_writes_the_given_out_buffer_and_returns_it():
    inputs = runnable(make_inputs(3, 1, 2, 16, 32, slot_pad=4, pad_rows=1, device=DEVICE, seed=3))
    ref_out, ref_rows = reference(inputs)
    out = torch.full((3, 2, 32), float("nan"), dtype=inputs.v.dtype, device=DEVICE)
    assert get("triton").decode(inputs, out=out) is out
    live = inputs.slots >= 0
    assert rel_err(out[live], ref_out[live]) <= 1e-2
    assert (out[~live] == 0).all()
    assert rel_err(inputs.state[inputs.slots[live].long()], ref_rows[live]) <= 1e-2


# ---- where it runs ------------------------------------------------------------------------------

def test_head_dims_outside_16_to_256_powers_of_two_are_unsupported():
    reason = get("triton").unsupported(make_inputs(1, 1, 1, 48, 32))
    assert reason and "K=48" in reason


def test_cpu_without_interpreter_says_why():
    code = ("from kda_impls import get, make_inputs; "
            "print(get('triton').unsupported(make_inputs(2, 1, 2, 16, 16)))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Triton runs on CPU only under TRITON_INTERPRET=1" in result.stdout


def test_versions_name_torch_and_triton():
    assert set(get("triton").versions()) == {"torch", "triton"}


# ---- tile config: table, heuristic, override ---------------------------------------------------------

def test_table_entries_parse_and_fit_their_shapes():
    for (dtype, HV, K, V, B, T), text in TABLE.items():
        config = TileConfig.parse(text, TileConfig(BV=V), source="TABLE")
        assert config.fitted(V, T) == config, (dtype, HV, K, V, B, T, text)


def test_table_lookup_takes_the_nearest_tabled_batch(monkeypatch):
    """Nearest in log2 of B; a tie (B=4 between 1 and 16, B=128 between 64 and 256) goes to the larger."""
    from kda_impls.impls.triton import tiles

    tile_of_batch = {1: 8, 16: 16, 64: 32, 256: 64}
    monkeypatch.setattr(tiles, "TABLE", {("bfloat16", 32, 128, 128, b, 1): f"BV={bv}"
                                         for b, bv in tile_of_batch.items()})
    for B, tabled in [(1, 1), (3, 1), (4, 16), (5, 16), (40, 64), (128, 256), (100, 64), (1000, 256)]:
        assert choose_config(torch.bfloat16, 32, 128, 128, B).BV == tile_of_batch[tabled], B
    # A multi-token step of a shape with only one-token entries takes those.
    assert choose_config(torch.bfloat16, 32, 128, 128, 40, T=4).BV == 32


def test_table_lookup_takes_the_nearest_tabled_tokens_then_batch(monkeypatch):
    from kda_impls.impls.triton import tiles

    monkeypatch.setattr(tiles, "TABLE", {("bfloat16", 32, 128, 128, 64, 1): "BV=64",
                                         ("bfloat16", 32, 128, 128, 8, 2): "BV=2",
                                         ("bfloat16", 32, 128, 128, 128, 2): "BV=4",
                                         ("bfloat16", 32, 128, 128, 8, 8): "BV=8"})
    for T, B, BV in [(1, 8, 64), (2, 8, 2), (2, 100, 4), (3, 1000, 4), (4, 1, 8), (16, 128, 8)]:
        assert choose_config(torch.bfloat16, 32, 128, 128, B, T).BV == BV, (T, B)


def test_fp16_state_uses_the_bf16_rows():
    assert table_key(torch.float16, 32, 128, 128, 64, 2) == table_key(torch.bfloat16, 32, 128, 128, 64, 2)


def test_heuristic_configs_are_legal():
    for K, V, esize, B in itertools.product((16, 64, 256), (16, 128, 256), (2, 4), (1, 64)):
        config = heuristic_config(K, V, esize, B)
        config.validate()
        assert config.fitted(V) == config


def test_untabled_shapes_use_the_heuristic():
    assert not any(key[1:4] == (48, 256, 64) for key in TABLE)
    assert choose_config(torch.float32, 48, 256, 64, 8) == heuristic_config(256, 64, 4, 8)


def test_config_override_from_the_environment(monkeypatch):
    inputs = make_inputs(1, 32, 32, 128, 128, n_slots=1, device="cpu")
    monkeypatch.setenv(CONFIG_ENV, "BV=16, num_warps=2")
    config = TritonKDA().config_for(inputs)
    tabled = choose_config(torch.bfloat16, 32, 128, 128, 1)
    assert config == replace(tabled, BV=16, num_warps=2)  # the fields it names, on the table's entry
    monkeypatch.setenv(CONFIG_ENV, "BV=256,subtiles=4")  # fitted to the shape: BV <= V, the sub-tiles V holds
    assert TritonKDA().config_for(inputs).BV == 128 and TritonKDA().config_for(inputs).subtiles == 1


@pytest.mark.parametrize("text, complaint", [
    ("BV=24", "BV must be a power of two"),
    ("num_warps=3", "num_warps must be a power of two"),
    ("subtiles=3", "subtiles must be a power of two"),
    ("const_heads=2", "const_heads must be 0 or 1"),
    ("state_first=-1", "state_first must be 0, 1 or 2"),
    ("state_first=3", "state_first must be 0, 1 or 2"),
    ("rewiden=2", "rewiden must be 0 or 1"),
    ("lookahead=2", "lookahead must be 0 or 1"),
    ("load_evict_first=2", "load_evict_first must be 0 or 1"),
    ("store_evict_first=-1", "store_evict_first must be 0 or 1"),
    ("fast_gate=2", "fast_gate must be 0 or 1"),
    ("tiled_inputs=2", "tiled_inputs must be 0 or 1"),
    ("programs_per_sm=65", "programs_per_sm must be in 0..64"),
    ("BV=thirty", "BV must be an integer"),
    ("tile=32", "is not NAME=VALUE"),
    ("BV", "is not NAME=VALUE"),
])
def test_bad_config_override_is_a_clear_error_at_bind(monkeypatch, text, complaint):
    inputs = runnable(make_inputs(2, 1, 2, 16, 16, device=DEVICE))
    monkeypatch.setenv(CONFIG_ENV, text)
    with pytest.raises(ValueError, match=complaint) as raised:
        TritonKDA().bind(inputs)
    assert CONFIG_ENV in str(raised.value)


def test_forced_config_is_validated():
    with pytest.raises(ValueError, match="BV must be a power of two"):
        TritonKDA(TileConfig(BV=12))


# Every config a test below reads, per (HV, D, T) shape, compiled in one process of
# scripts.tuning.triton_registers the first time a test asks for that shape. HV = 64, K = V = 64 (a shape
# the table tunes) unless a count needs the 128-wide rows: a compile there costs three times as much.
SM90_CONFIGS = {
    (64, 64, 1): ["BV=8,num_warps=1", "BV=8,num_warps=1,state_first=1", "BV=8,num_warps=1,state_first=1,fast_gate=1",
                  "BV=8,num_warps=1,programs_per_sm=8", "BV=8,num_warps=1,programs_per_sm=8,fast_gate=1",
                  "BV=8,num_warps=1,programs_per_sm=8,lookahead=0",
                  "BV=8,num_warps=1,programs_per_sm=8,load_evict_first=0,store_evict_first=0",
                  "BV=16,num_warps=1,state_first=1", "BV=16,num_warps=1,state_first=1,load_evict_first=0",
                  "BV=16,num_warps=1,state_first=1,store_evict_first=0", "BV=16,num_warps=4",
                  "BV=32,num_warps=1", "BV=32,num_warps=1,state_first=1", "BV=32,num_warps=1,state_first=2",
                  "BV=32,num_warps=1,rewiden=1",
                  "BV=4,num_warps=1,const_heads=1,state_first=2,rewiden=1,fast_gate=1",
                  "BV=4,num_warps=1,const_heads=1,state_first=2,rewiden=1,fast_gate=1,tiled_inputs=1"],
    (64, 64, 4): ["BV=8,num_warps=1", "BV=8,num_warps=1,fast_gate=1",
                  "BV=8,num_warps=1,load_evict_first=0,store_evict_first=0"],
    (32, 128, 1): ["BV=8,num_warps=1", "BV=4,num_warps=1,state_first=1,const_heads=1,fast_gate=1",
                   "BV=8,num_warps=1,state_first=1,const_heads=1,fast_gate=1"],
}


# The batch the compiles draw their inputs at: the kernel, its signature and its constexprs do not depend
# on B (test_the_offline_compile_is_the_same_at_any_batch), and a smaller pool draws in a sixteenth of the time.
COMPILE_B = 16


def _offline_sm90(cache: Path, configs: str, HV: int, D: int, T: int = 1) -> list[list[str]]:
    asked = configs.split(";")
    cache.mkdir(exist_ok=True)
    path = cache / f"HV{HV}-D{D}-T{T}.json"
    with FileLock(f"{path}.lock"):  # one compile of a shape for all workers of the run
        known = json.loads(path.read_text()) if path.exists() else {"skip": None, "rows": {}}
        missing = [c for c in dict.fromkeys(asked + SM90_CONFIGS.get((HV, D, T), [])) if c not in known["rows"]]
        if missing and known["skip"] is None:
            done = subprocess.run([sys.executable, "-m", "scripts.tuning.triton_registers",
                                   "--configs", ";".join(missing),
                                   "--state-dtypes", "bfloat16", "--HV", str(HV), "--D", str(D), "--B", str(COMPILE_B),
                                   "--T", str(T)], capture_output=True, text=True, cwd=REPO,
                                  timeout=120 + 60 * len(missing))  # a compile takes seconds; a loaded box, more
            if done.returncode == 2 and "no ptxas here" in done.stdout:
                known["skip"] = done.stdout.strip()
            else:
                assert done.returncode == 0, done.stdout + done.stderr
                rows = [line.split() for line in done.stdout.splitlines() if line.startswith("bfloat16")]
                assert len(rows) == len(missing), done.stdout
                known["rows"].update(zip(missing, rows, strict=True))
            path.write_text(json.dumps(known))
    if known["skip"] is not None:
        pytest.skip(known["skip"])
    return [known["rows"][c] for c in asked]


@pytest.fixture(scope="session")
def offline_sm90(tmp_path_factory):
    """offline_sm90(configs, HV, D, T=1): scripts.tuning.triton_registers's line per config (bf16 state,
    B = COMPILE_B, T tokens), split into fields: state, config, kernel, regs, spill, warps/SM, SASS to the
    first load, SASS, MUFU.LG2, state load spread, loads before the first warp-wide instruction,
    shuffles, WARPSYNCs, evict-first loads, evict-first stores, TMA loads, loads before the first 16-byte
    one, asynchronous copies, SASS digest. Each shape compiled once per run (SM90_CONFIGS with it), kept
    in a directory the xdist workers share. Skips where no ptxas here reads this Triton's PTX."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # each worker's base directory is a folder of the run's
    return functools.partial(_offline_sm90, shared / "offline-sm90")


@pytest.mark.parametrize("config, T", [("BV=8,num_warps=1,programs_per_sm=8", 1), ("BV=16,num_warps=4", 1),
                                       ("BV=8,num_warps=1", 4)])
def test_the_offline_compile_is_the_same_at_any_batch(config, T):
    """What triton.compile is given (the kernel, its signature, constexprs and options) at COMPILE_B is what
    it is given at B = 256, the batch the tuning table is read at: the compiles above stand for B = 256."""
    from scripts.tuning.triton_registers import signature

    def compiled_from(B: int):
        inputs = make_inputs(B, 64, 64, 64, 64, T=T, seed=0)
        tile = TileConfig.parse(config, TileConfig(BV=64), source="test").fitted(64, T)
        kernel, _, args, meta = the_launch(inputs, torch.empty(inputs.out_shape, dtype=inputs.v.dtype), tile)
        return kernel.fn.__name__, signature(kernel, args, meta), meta

    assert compiled_from(COMPILE_B) == compiled_from(256)


def test_state_first_issues_the_state_load_ahead_of_the_small_inputs(offline_sm90):
    """state_first=1 compiles the bf16 32-row tile (HV=64 K=V=64, the tile it slowed on the H200)
    with fewer of the small inputs' loads ahead of the first 16-byte state load than state_first=0
    (8 against 2 under Triton 3.6: results/offline-sm90/triton36/load_order_hv64_d64*.txt): fails if
    the kernel ignores the field or reads it the wrong way round; state_first=2 (between the small
    inputs' loads and the gate) compiles to code of its own."""
    rows = offline_sm90("BV=32,num_warps=1;BV=32,num_warps=1,state_first=1;BV=32,num_warps=1,state_first=2", 64, 64)
    if rows[0][-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    (after, after_digest), (first, first_digest), (_, between_digest) = ((int(r[16]), r[-1]) for r in rows)
    assert first < after and first_digest != after_digest, rows
    assert between_digest not in (first_digest, after_digest), rows  # state_first=2: a third order


def test_persistent_form_without_the_tile_look_ahead_compiles_to_its_own_code(offline_sm90):
    """lookahead=0 keeps no next tile in registers: the persistent 8-row bf16 tile compiles to other
    code, on no more registers than with the look-ahead (72 and 59 at K=V=64 under Triton 3.9; fails if
    the field is ignored)."""
    ahead, slots_only = offline_sm90("BV=8,num_warps=1,programs_per_sm=8;"
                                     "BV=8,num_warps=1,programs_per_sm=8,lookahead=0", 64, 64)
    assert int(slots_only[3]) <= int(ahead[3]), (ahead, slots_only)
    if ahead[-1] != "None":  # a SASS digest, where cuobjdump is beside this Triton
        assert slots_only[-1] != ahead[-1], (ahead, slots_only)


def test_eviction_hints_mark_only_the_state_accesses_they_name(offline_sm90):
    """load_evict_first and store_evict_first reach the SASS: by default every state load and store
    is marked evict-first (.EF) and nothing else is; each field at 0 clears its own accesses' marks
    alone, in the one-program-per-tile, the persistent and the multi-token kernels (fails if a field is
    ignored, crossed or applied to the other form's accesses)."""
    rows = offline_sm90("BV=16,num_warps=1,state_first=1;BV=16,num_warps=1,state_first=1,load_evict_first=0;"
                        "BV=16,num_warps=1,state_first=1,store_evict_first=0;BV=8,num_warps=1,programs_per_sm=8;"
                        "BV=8,num_warps=1,programs_per_sm=8,load_evict_first=0,store_evict_first=0", 64, 64)
    if rows[0][-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    (plain, no_loads, no_stores, persistent, persistent_unhinted) = ((int(r[13]), int(r[14])) for r in rows)
    # 16 rows of 64 bf16 in 16-byte accesses on one warp: 4 loads and 4 stores per thread
    assert plain == (4, 4) and no_loads == (0, 4) and no_stores == (4, 0), rows
    assert persistent[0] > 0 and persistent[1] > 0 and persistent_unhinted == (0, 0), rows
    multitoken = offline_sm90("BV=8,num_warps=1;BV=8,num_warps=1,load_evict_first=0,store_evict_first=0", 64, 64, T=4)
    (hinted, unhinted) = ((int(r[13]), int(r[14])) for r in multitoken)
    assert hinted[0] > 0 and hinted[1] > 0 and unhinted == (0, 0), multitoken


def test_fast_gate_takes_its_log2_from_mufu_in_every_form(offline_sm90):
    """fast_gate=1 computes the gate's log2 with MUFU.LG2 (lg2.approx) in the one-program-per-tile,
    persistent and multi-token kernels, where fast_gate=0 has none (libdevice's logf is a
    polynomial): fails if the field is ignored or a form calls tl.log2 on the GPU. Fewer instructions
    in all (640 against 824 in the bf16 8-row tile B = 1 ran under Triton 3.6 at K=V=128; 400 against
    480 here at K=V=64 under 3.9)."""
    forms = ("BV=8,num_warps=1,state_first=1", "BV=8,num_warps=1,programs_per_sm=8")
    rows = offline_sm90(";".join(f"{form}{gate}" for form in forms for gate in ("", ",fast_gate=1")), 64, 64)
    if rows[0][-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    rows += offline_sm90("BV=8,num_warps=1;BV=8,num_warps=1,fast_gate=1", 64, 64, T=4)
    for libdevice, fast in zip(rows[::2], rows[1::2], strict=True):
        assert int(libdevice[8]) == 0 < int(fast[8]), (libdevice, fast)
        assert int(fast[7]) < int(libdevice[7]), (libdevice, fast)  # SASS instructions in all


def test_state_load_spread_counts_from_the_first_state_load_to_the_last(offline_sm90):
    """triton_registers.py's state load spread: at K=V=128 the 4-row base-2 tile's two 16-byte state
    loads a thread go out together, and the 8-row base-2 tile's four spread through the gate (11 against
    262 under Triton 3.6: results/offline-sm90/triton36/fast_gate_hv32_d128.txt): fails if the column
    counts other loads or the wrong span."""
    fast = "num_warps=1,state_first=1,const_heads=1,fast_gate=1"
    rows = offline_sm90(f"BV=4,{fast};BV=8,{fast}", 32, 128)
    if rows[0][-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    four_rows, eight_rows = (r[9] for r in rows)
    assert 0 < int(four_rows) < int(eight_rows), rows


def test_tiled_inputs_issue_every_load_before_the_first_warp_wide_instruction(offline_sm90):
    """The bf16 K=V=64 4-row tile (the table's B = 1 entry at HV=64 before tiled_inputs) loads q and k
    as vectors whose layout changes to meet the tile: under Triton 3.6 (the H200's) through shared
    memory, before which ptxas issues only the slot's, q's and k's loads; under either Triton at least
    one of its nine loads goes out after the first warp-wide instruction. With tiled_inputs nothing
    changes layout and all ten loads go out first (3 and 10 under 3.6:
    results/offline-sm90/triton36/tiled_inputs_hv64_d64.txt; 8 and 10 under 3.9:
    results/offline-sm90/tiled_inputs_hv64_d64.txt): fails if the field is ignored or if
    triton_registers.py's column counts the loads past that instruction (9 and 10)."""
    tile = "BV=4,num_warps=1,const_heads=1,state_first=2,rewiden=1,fast_gate=1"
    rows = offline_sm90(f"{tile};{tile},tiled_inputs=1", 64, 64)
    if rows[0][-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    vectors, tiled = (int(r[10]) for r in rows)
    assert vectors < 9 and tiled == 10, rows


def test_shuffle_column_counts_the_reductions_steps(offline_sm90):
    """triton_registers.py's SHFL column: the bf16 8-row one-warp tile at K=V=128 gives a row 16 lanes
    and a thread four rows, so its two reductions take at least 4 x 4 x 2 = 32 shuffles; at K=V=64 a row
    has 8 lanes and a thread two rows, at least 3 x 2 x 2 = 12 (66 and 24 under Triton 3.9). Fails if the
    column counts nothing, or every instruction."""
    wide, narrow = (offline_sm90("BV=8,num_warps=1", HV, D)[0] for HV, D in ((32, 128), (64, 64)))
    if wide[-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    assert int(narrow[11]) < 32 <= int(wide[11]) < int(wide[7]) // 4, (wide, narrow)


def test_rewiden_compiles_to_its_own_code(offline_sm90):
    """rewiden=1 compiles to other code than the tile widened once (fails if the field is ignored)."""
    plain, rewidened = offline_sm90("BV=32,num_warps=1;BV=32,num_warps=1,rewiden=1", 64, 64)
    if plain[-1] == "None":
        pytest.skip("no cuobjdump beside this Triton")
    assert rewidened[-1] != plain[-1], (plain, rewidened)


# ---- on the GPU ---------------------------------------------------------------------------------------

GPU_GRID = list(itertools.product((1, 8, 64, 512), (16, 32, 64), ((64, 64), (128, 128), (128, 256)), (0, 16, 64),
                                  ("bfloat16", "float32")))


@gpu
@pytest.mark.parametrize("B, HV, KV, slot_pad, state_dtype", GPU_GRID,
                         ids=[f"B{b}-HV{hv}-K{k}V{v}-pad{p}-{d}" for b, hv, (k, v), p, d in GPU_GRID])
def test_h200_grid(B, HV, KV, slot_pad, state_dtype):
    K, V = KV
    inputs = make_inputs(B, HV, HV, K, V, state_dtype=getattr(torch, state_dtype), slot_pad=slot_pad,
                         pad_rows=B // 8, n_slots=B + 3, device="cuda", seed=B + HV + slot_pad)
    verdict = verify(get("triton"), inputs)
    assert verdict.ok, verdict


@gpu
@pytest.mark.parametrize("HV", [16, 64])
def test_gva_on_gpu(HV):
    inputs = make_inputs(64, HV // 4, HV, 128, 128, slot_pad=16, pad_rows=8, n_slots=70, device="cuda", seed=HV)
    verdict = verify(get("triton"), inputs)
    assert verdict.ok, verdict


@gpu
@pytest.mark.parametrize("config", [TileConfig(BV=4, num_warps=1, const_heads=1, state_first=1, fast_gate=1),
                                    TileConfig(BV=8, num_warps=1, subtiles=4, rewiden=1, fast_gate=1),
                                    TileConfig(BV=8, num_warps=1, programs_per_sm=4, fast_gate=1),
                                    TileConfig(BV=4, num_warps=1, const_heads=1, state_first=2, rewiden=1, fast_gate=1,
                                               tiled_inputs=1)],
                         ids=str)
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fast_gate_forms_on_gpu(config, state_dtype):
    """The base-2 gate on the GPU, where its log2 is MUFU's (the interpreter runs tl.log2): each form,
    the small inputs loaded as tiles among them, on real shapes with -1 rows, padded slots and gates
    far into softplus' tails on both sides."""
    for B, KV in ((1, 128), (33, 64)):
        inputs = make_inputs(B, 32, 32, KV, KV, state_dtype=state_dtype, slot_pad=16, pad_rows=B // 8, n_slots=B + 3,
                             device="cuda", seed=B + KV)
        inputs.a.mul_(8)  # |a + dt_bias| up to ~30: past the softplus threshold and exp(x) ~ 1e-13
        verdict = verify(TritonKDA(config), inputs)
        assert verdict.ok, verdict


@gpu
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cuda_graph_replay_equals_eager(state_dtype):
    inputs = make_inputs(64, 32, 32, 128, 128, state_dtype=state_dtype, slot_pad=16, pad_rows=8, n_slots=72,
                         device="cuda", seed=21)
    assert_graph_replay_takes_eager_step("triton", inputs)


@gpu
def test_launcher_allocates_nothing():
    assert_launch_allocates_nothing("triton", make_inputs(64, 32, 32, 128, 128, device="cuda", seed=1))


@gpu
def test_config_override_reaches_the_compiled_kernel(monkeypatch):
    from kda_impls.impls.triton.kernel import compile_launches

    inputs = make_inputs(16, 32, 32, 128, 128, slot_pad=64, pad_rows=2, n_slots=20, device="cuda", seed=8)
    monkeypatch.setenv(CONFIG_ENV, "BV=16,num_warps=2")
    config = TritonKDA().config_for(inputs)
    # the fields named replace the table's entry's; the others (its state order) stay
    tabled = choose_config(inputs.state.dtype, 32, 128, 128, 16)
    assert config == replace(tabled, BV=16, num_warps=2).fitted(128)
    out = torch.empty(16, 32, 128, dtype=inputs.v.dtype, device="cuda")
    (compiled,) = compile_launches(inputs, launches(inputs, out, config))
    assert compiled.metadata.num_warps == 2
    verdict = verify(TritonKDA(), inputs)
    assert verdict.ok, verdict


def test_register_script_specialises_arguments_as_the_launcher_does():
    """An integer argument equal to 1 is a constant in the launched kernel (Triton's launcher
    specialises it), a 16-divisible one is marked so, the rest are i32: otherwise the offline counts
    would compile a GVA group of 1 as a variable and overstate the kernel's prologue."""
    from scripts.tuning.triton_registers import signature

    class Kernel:
        arg_names = ["x_ptr", "n", "one", "big", "scale", "BLOCK"]

    types, constexprs, attrs = signature(Kernel, (torch.empty(4), 7, 1, 64, 0.5), {"BLOCK": 16, "num_warps": 1})
    assert types == {"x_ptr": "*fp32", "n": "i32", "big": "i32", "scale": "fp32", "one": "constexpr",
                     "BLOCK": "constexpr"}, types
    assert constexprs == {(2,): 1, (5,): 16}, constexprs
    assert attrs == {(0,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]}, attrs


def test_register_script_compiles_for_sm90_without_a_gpu():
    """scripts.tuning.triton_registers: the launcher's kernel and arguments compiled offline. A 32-row
    tile holds more registers than an 8-row one (each config compiled as it is), and the 8-row tile
    B = 1 uses reaches its first load within 40 instructions with the head counts compiled in, sooner
    than with them passed at run time and divided by on the way (21 against 43 at HV=32 K=V=128 under
    Triton 3.6: results/offline-sm90/triton36/; 17 against 43 at HV=64 K=V=64, compiled here, under 3.9)."""
    done = subprocess.run([sys.executable, "-m", "scripts.tuning.triton_registers", "--configs",
                           "BV=32,num_warps=1;BV=8,num_warps=1,const_heads=1;BV=8,num_warps=1",
                           "--state-dtypes", "bfloat16", "--B", "1", "--HV", "64", "--D", "64"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    if done.returncode == 2 and "no ptxas here" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("bfloat16")]
    regs = [int(row[3]) for row in rows]
    assert len(rows) == 3 and regs[0] > regs[2], done.stdout
    if rows[1][6] != "None":  # cuobjdump is there
        assert int(rows[1][6]) <= 40 and int(rows[1][6]) < int(rows[2][6]), done.stdout


def test_rewiden_reaches_the_launch():
    inputs = make_inputs(3, 2, 4, 32, 32, state_dtype=torch.bfloat16, seed=1)
    out = torch.empty(3, 4, 32, dtype=inputs.v.dtype)
    assert the_launch(inputs, out, TileConfig(BV=8, num_warps=1))[3]["REWIDEN"] == 0
    assert the_launch(inputs, out, TileConfig(BV=8, num_warps=1, rewiden=1))[3]["REWIDEN"] == 1
    # the persistent form and the multi-token kernel have no re-widened form
    assert TileConfig(BV=8, rewiden=1, programs_per_sm=2).fitted(32).rewiden == 0
    assert TileConfig(BV=8, rewiden=1).fitted(32, T=2).rewiden == 0


