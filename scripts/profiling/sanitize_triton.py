"""Run the Triton KDA decode kernel once per tile config on a small padded pool with -1 rows, for
compute-sanitizer. Each run is also checked by kda_impls.verify; exits 1 if any is wrong.

    compute-sanitizer --tool memcheck --error-exitcode 99 python3 -m scripts.profiling.sanitize_triton
    compute-sanitizer --tool racecheck --error-exitcode 99 python3 -m scripts.profiling.sanitize_triton

:func:`main` switches torch's caching allocator off before the first CUDA allocation
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) so that every tensor is its own allocation: an access past the
pool then lands outside any allocation, where memcheck sees it, rather than in a neighbouring tensor's
block.
"""

from __future__ import annotations

import os
import sys

import torch

from kda_impls import make_inputs, verify
from kda_impls.impls.triton.kernel import TritonKDA
from kda_impls.impls.triton.tiles import TileConfig

# The table's choice, several V-tiles, the persistent form (48 tiles over min(48, SMs) programs: the
# last programs' look-ahead runs past the last tile, where nothing may be read), sub-tiles (two
# programs per head, each walking four 16-row tiles), the head counts compiled in (the other
# configs pass them at run time), the state loaded before the small inputs or between their loads
# and the gate (the other one-tile configs load it after the gate), the stored tile widened
# twice (alone, and with sub-tiles), the persistent form looking ahead only at the slots, the
# state's accesses without eviction hints, the gate in base 2 (the tabled B = 1 tiles: one program
# per tile with the head counts compiled in; the persistent form), and the small inputs loaded as
# tiles (a B = 1 tile; two 16-row sub-tiles a program; the tabled bf16 B = 1 tile of four warps,
# 4 rows each).
CONFIGS = [None, TileConfig(BV=16, num_warps=2),
           TileConfig(BV=16, num_warps=1, programs_per_sm=1), TileConfig(BV=16, num_warps=1, subtiles=4),
           TileConfig(BV=16, num_warps=2, const_heads=1), TileConfig(BV=16, num_warps=2, state_first=1),
           TileConfig(BV=16, num_warps=2, state_first=2),
           TileConfig(BV=16, num_warps=1, rewiden=1),
           TileConfig(BV=16, num_warps=1, subtiles=4, rewiden=1),
           TileConfig(BV=16, num_warps=1, programs_per_sm=1, lookahead=0),
           TileConfig(BV=16, num_warps=2, load_evict_first=0, store_evict_first=0),
           TileConfig(BV=4, num_warps=1, const_heads=1, state_first=2, fast_gate=1),
           TileConfig(BV=16, num_warps=1, programs_per_sm=1, fast_gate=1),
           TileConfig(BV=4, num_warps=1, const_heads=1, state_first=2, rewiden=1, fast_gate=1, tiled_inputs=1),
           TileConfig(BV=16, num_warps=2, subtiles=2, tiled_inputs=1),
           TileConfig(BV=16, num_warps=4, const_heads=1, state_first=1, rewiden=1, fast_gate=1, tiled_inputs=1)]


def main() -> int:
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")  # read when the allocator starts
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    failures = 0
    for state_dtype in (torch.bfloat16, torch.float32):
        for config in CONFIGS:
            # GVA (H=2, HV=4), K != V, 16 elements of padding per slot, 2 of 6 rows -1; the first
            # and last slots of the pool are live, so an overrun either way leaves the allocation.
            inputs = make_inputs(6, 2, 4, 64, 128, state_dtype=state_dtype, slot_pad=16, n_slots=8, device="cuda",
                                 seed=3)
            inputs.slots = torch.tensor([7, -1, 2, 0, -1, 5], dtype=torch.int32, device="cuda")
            impl = TritonKDA(config)
            verdict = verify(impl, inputs)
            torch.cuda.synchronize()
            status = "ok" if verdict.ok else "WRONG"
            print(f"{str(state_dtype):15} {str(impl.config_for(inputs)):40} {status} {verdict}")
            failures += not verdict.ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
