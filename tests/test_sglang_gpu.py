"""The SGLang adapters against the float64 reference on a GPU (sm_90+ for the CuTe-DSL decode), with the
sglang wheel installed without its dependencies (``python3 -m pip install --no-deps sglang==0.5.23``) and
``.[sglang]``; a call refused here skips with its reason (``sglang-triton`` without SGLang's serving
dependencies)."""

import pytest
import torch
from test_sglang_replay import staggered

from kda_impls import get, make_inputs, verify
from kda_impls.impls.sglang_kda import INSTALL, sglang_dir
from kda_impls.verify import bits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(sglang_dir() is None, reason=f"sglang not installed ({INSTALL})")]

IN_PLACE = [
    dict(B=4, H=32, HV=32, K=128, V=128, slot_pad=64, pad_rows=1),  # the CuTe-DSL small-batch kernel (B < 32)
    dict(B=64, H=32, HV=32, K=128, V=128, slot_pad=16, pad_rows=8),  # the large-batch kernel, -1 rows
    dict(B=64, H=16, HV=32, K=128, V=128, state_dtype=torch.float32),  # GVA, fp32 state
    dict(B=1, H=32, HV=32, K=128, V=128),  # one row: the wrapper's dense form
    dict(B=8, H=8, HV=16, K=128, V=256, n_slots=20),  # V = 256
]
REPLAY = [
    dict(B=16, H=32, HV=32, K=128, V=128, slot_pad=64, pad_rows=2),
    dict(B=64, H=16, HV=32, K=128, V=128),  # GVA
]


def runs_or_skips(name, x):
    reason = get(name).unsupported(x)
    if reason:
        pytest.skip(reason)
    verdict = verify(get(name), x)
    assert verdict.ok, verdict


@pytest.mark.parametrize("case", IN_PLACE)
@pytest.mark.parametrize("name", ["sglang-cutedsl", "sglang-triton"])
def test_in_place_decode_matches_the_reference(name, case):
    pool = dict(state_dtype=torch.float32) if name == "sglang-cutedsl" else {}  # its only pool dtype
    runs_or_skips(name, make_inputs(**case | pool, device="cuda", seed=41))


@pytest.mark.parametrize("case", REPLAY)
def test_replay_matches_the_reference_over_a_flush(case):
    L = 16
    runs_or_skips("sglang-replayssm", staggered(make_inputs(**case, ring=L, device="cuda", seed=42), L))


def test_every_graph_replay_advances_the_cursor_on_the_gpu():
    """SGLang #38398 on the GPU: replayed from one captured CUDA graph, as the timer and the engines replay
    it, the step writes each live slot's pool block exactly when its ring fills (a cursor fixed at capture
    would write the same slots at every replay, or none)."""
    L = 16
    x = staggered(make_inputs(**REPLAY[0], ring=L, device="cuda", seed=43), L)
    reason = get("sglang-replayssm").unsupported(x)
    if reason:
        pytest.skip(reason)
    slots = x.slots.long()[x.live_rows()]
    start = x.cache.length[slots].long().cpu()
    launch = get("sglang-replayssm").bind(x)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    writes, launches = torch.zeros(len(slots), dtype=torch.int64), 2 * L + 1

    def counted(step):
        before = x.state[slots].clone()
        step()
        torch.cuda.synchronize()
        writes.add_((bits(x.state[slots]) != bits(before)).flatten(1).any(dim=1).long().cpu())

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        counted(launch)  # the warm-up before capture: a step like the others
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        launch()
    for _ in range(launches - 1):
        counted(graph.replay)
    assert torch.equal(writes, (start + launches) // L)
