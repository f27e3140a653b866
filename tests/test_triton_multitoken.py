"""Our Triton kernel on multi-token steps (T tokens per row) against the float64 reference.

As in tests/test_triton.py: small shapes run on the GPU when there is one, else under
TRITON_INTERPRET=1 on the CPU; the tests marked ``gpu`` are the H200 grid. Every check goes
through kda_impls.verify: output poisoned with NaN, every stored slot and the output against the
reference, untouched slots (those of padding rows included) and the padding between slots bit for bit.
"""

import itertools

import pytest
import torch

from helpers import DEVICE, assert_graph_replay_takes_eager_step, assert_launch_allocates_nothing, runnable, with_gaps
from kda_impls import get, make_inputs, reference, rel_err, verify
from kda_impls.impls.triton.kernel import TritonKDA, launches
from kda_impls.impls.triton.tiles import TileConfig

gpu = pytest.mark.gpu
pytestmark = pytest.mark.usefixtures("no_config_override")


# Every (T, checkpoints) pair once, the state dtype alternating along both: each T and each
# checkpoint form also runs in bf16 and in fp32, at half the product's interpreted runs.
@pytest.mark.interpreter
@pytest.mark.parametrize("T, checkpoints, state_dtype", [
    pytest.param(T, checkpoints, dtype, id=f"{T}-{checkpoints}-{name}")
    for i, (T, checkpoints) in enumerate(itertools.product([1, 2, 3, 4], ["all", "last"]))
    for name, dtype in [[("bf16", torch.bfloat16), ("fp32", torch.float32)][(i + i // 2) % 2]]])
def test_matches_reference(T, checkpoints, state_dtype):
    x = make_inputs(3, 1, 2, 16, 32, T=T, checkpoints=checkpoints, state_dtype=state_dtype, slot_pad=16,
                    pad_rows=1, device=DEVICE, seed=T)
    verdict = verify(get("triton"), runnable(x.per_token_spelling()))
    assert verdict.ok, verdict


CASES = {
    "gva-gaps-padded": dict(B=4, H=1, HV=4, K=16, V=32, T=3, slot_pad=7, pad_rows=1, gaps=True),
    "k>v-gaps-big-pool": dict(B=3, H=2, HV=2, K=64, V=16, T=4, slot_pad=16, n_slots=40, gaps=True),
    "one-row": dict(B=1, H=1, HV=2, K=16, V=16, T=2, n_slots=2),
    "all-rows-padding": dict(B=2, H=1, HV=2, K=16, V=16, T=3, pad_rows=2),
}


# Each case in two of the three state dtypes, each dtype on at least two cases.
STATE_DTYPES = [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]


@pytest.mark.interpreter
@pytest.mark.parametrize("case, state_dtype", [
    pytest.param(case, dtype, id=f"{name}-{dtype_name}") for i, (name, case) in enumerate(CASES.items())
    for dtype_name, dtype in (STATE_DTYPES[i % 3], STATE_DTYPES[(i + 1) % 3])])
def test_cases_match_reference(case, state_dtype):
    case = dict(case)
    gaps = case.pop("gaps", False)
    x = make_inputs(**case, state_dtype=state_dtype, device=DEVICE, seed=5)
    verdict = verify(get("triton"), runnable(with_gaps(x) if gaps else x))
    assert verdict.ok, verdict


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_activation_dtypes(dtype):
    x = make_inputs(3, 2, 4, 32, 16, T=3, state_dtype=torch.float32, dtype=dtype, slot_pad=8, pad_rows=1,
                    device=DEVICE, seed=9)
    verdict = verify(get("triton"), runnable(x))
    assert verdict.ok, verdict
    if dtype == torch.float32:
        assert verdict.err_out <= 1e-5 and verdict.err_state <= 1e-5, verdict


# Several V-tiles (BV=8 of V=16), a tile taller than V, the gate in base 2.
FORCED = [
    TileConfig(BV=8, num_warps=1),
    TileConfig(BV=64, num_warps=2),
    TileConfig(BV=8, num_warps=1, fast_gate=1),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("config", FORCED, ids=str)
def test_forced_tile_configs(config):
    x = with_gaps(make_inputs(3, 3, 6, 16, 16, T=3, slot_pad=16, pad_rows=1, device=DEVICE, seed=13))
    verdict = verify(TritonKDA(config), runnable(x), steps=1)  # the mapping: compounding is test_matches_reference's
    assert verdict.ok, verdict


@pytest.mark.interpreter
def test_without_num_accepted_rows_start_from_their_first_slot():
    x = make_inputs(3, 1, 2, 16, 16, T=3, state_dtype=torch.float32, device=DEVICE, seed=4)
    x.num_accepted = None
    x.scale = 0.3
    verdict = verify(get("triton"), runnable(x))
    assert verdict.ok, verdict


@pytest.mark.interpreter
def test_writes_the_given_out_buffer_and_returns_it():
    x = runnable(make_inputs(3, 1, 2, 16, 32, T=2, slot_pad=4, pad_rows=1, device=DEVICE, seed=3))
    ref_out, ref_states = reference(x)
    stored, live = x.stored(), x.live_rows()
    out = torch.full((3, 2, 2, 32), float("nan"), dtype=x.v.dtype, device=DEVICE)
    assert get("triton").decode(x, out=out) is out
    assert rel_err(out[live], ref_out[live]) <= 1e-2 and (out[~live] == 0).all()
    assert rel_err(x.state[x.slots[stored].long()], ref_states[stored]) <= 1e-2


def test_t1_in_either_spelling_launches_the_one_token_kernel():
    from kda_impls.impls.triton.inplace import _kda_decode_kernel
    from kda_impls.impls.triton.multitoken import _kda_multitoken_kernel

    one = make_inputs(2, 1, 2, 16, 16, seed=1)
    config = TileConfig(BV=16)
    for x in (one, one.per_token_spelling()):
        ((kernel, *_),) = launches(x, torch.empty(x.out_shape, dtype=x.v.dtype), config)
        assert kernel is _kda_decode_kernel
    x = make_inputs(2, 1, 2, 16, 16, T=2, seed=1)
    ((kernel, _, args, _),) = launches(x, torch.empty(x.out_shape, dtype=x.v.dtype), config)
    assert kernel is _kda_multitoken_kernel and args[-1] == 2 and torch.equal(args[9], x.num_accepted)


def test_declares_any_number_of_tokens():
    assert get("triton").capabilities.max_tokens is None
    # whatever stops it on this machine stops T = 1 too
    assert get("triton").unsupported(make_inputs(2, 1, 2, 16, 16, T=16)) == get("triton").unsupported(
        make_inputs(2, 1, 2, 16, 16))


# ---- on the GPU ---------------------------------------------------------------------------------------

GPU_GRID = list(itertools.product((1, 2, 4, 8), (1, 8, 64), (16, 32), (64, 128), (0, 64), ("bfloat16", "float32")))


@gpu
@pytest.mark.parametrize("T, B, HV, KV, slot_pad, state_dtype", GPU_GRID,
                         ids=[f"T{t}-B{b}-HV{hv}-K{kv}V{kv}-pad{p}-{d}" for t, b, hv, kv, p, d in GPU_GRID])
def test_h200_grid(T, B, HV, KV, slot_pad, state_dtype):
    """Random num_accepted in [1, T], every token storing, B // 8 padding rows; T = 1 in the
    per-token spelling (the one-token spelling has tests/test_triton.py's grid)."""
    x = make_inputs(B, HV, HV, KV, KV, T=T, state_dtype=getattr(torch, state_dtype), slot_pad=slot_pad,
                    pad_rows=B // 8, device="cuda", seed=T * 1000 + B + HV + slot_pad)
    verdict = verify(get("triton"), x.per_token_spelling())
    assert verdict.ok, verdict


@gpu
@pytest.mark.parametrize("checkpoints", ["all", "last"])
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gva_gaps_and_last_checkpoint_on_gpu(checkpoints, state_dtype):
    x = make_inputs(64, 8, 32, 128, 128, T=4, checkpoints=checkpoints, state_dtype=state_dtype, slot_pad=16,
                    pad_rows=8, device="cuda", seed=17)
    verdict = verify(get("triton"), with_gaps(x) if checkpoints == "all" else x)
    assert verdict.ok, verdict


@gpu
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cuda_graph_replay_equals_eager(state_dtype):
    x = make_inputs(64, 32, 32, 128, 128, T=4, state_dtype=state_dtype, slot_pad=16, pad_rows=8, device="cuda",
                    seed=21)
    assert_graph_replay_takes_eager_step("triton", x)


@gpu
def test_launcher_allocates_nothing():
    x = make_inputs(64, 32, 32, 128, 128, T=4, device="cuda", seed=1)
    x.num_accepted = None  # the all-ones default is allocated at bind, not per launch
    assert_launch_allocates_nothing("triton", x)
