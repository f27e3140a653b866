"""Registers, spills and instruction counts of the Triton KDA decode kernel per tile config,
compiled for the H200 (sm_90) on any machine: no GPU needed. Under TRITON_INTERPRET :func:`main` runs
itself again without it (Triton reads it when it is imported): the kernels are compiled, not interpreted.

    python3 -m scripts.tuning.triton_registers                      # CONFIGS at HV=32 K=V=128, bf16 and fp32
    python3 -m scripts.tuning.triton_registers --configs "BV=32,num_warps=1;BV=32,num_warps=1,const_heads=1" --T 4
    python3 -m scripts.tuning.triton_registers --table --HV 32 --D 128   # every tabled entry of a shape
    python3 -m scripts.tuning.triton_registers --frozen "default;w_parts=2" --T 8  # frozen verify's launches
    python3 -m scripts.tuning.triton_registers --replay "default;BV=32"            # a replay step's launches

Each config is fitted to the shape and compiled as the launcher would launch it
(kda_impls.impls.triton.kernel.launches: the same kernel, constexprs and argument types, slot
stride and pointers 16-divisible), to PTX by this machine's Triton, then assembled by ``ptxas -v``
for sm_90a (the first of Triton's bundled assemblers and CUDA's that reads that PTX), and
disassembled by Triton's bundled ``cuobjdump``. Prints one line per config: registers per thread,
spill bytes, the warps per SM the registers allow (65536 registers per SM, at most 32 programs), the
SASS instructions before the first global load (the latency a small step waits before its first DRAM
access) and in all, the MUFU.LG2 instructions (the base-2 gate's log2, ``fast_gate``), the
instructions from the state's first 16-byte load to its last (a tile whose loads ptxas spreads
through the gate waits a second round trip for the last ones), the global loads issued before the
first warp-wide instruction (a shuffle, a shared-memory access or a barrier: in the compiles read,
ptxas moved no load above one, so a warp stalled there on an input issues the loads after it a round
trip late: ``tiled_inputs``), the shuffles (``SHFL``: each reduction along K takes log2 of the lanes
sharing a row), the ``WARPSYNC`` instructions (ptxas wraps a shuffle inside a branch it cannot prove
uniform in one), the global loads and stores marked evict-first (``.EF``: the state's,
under ``load_evict_first`` and ``store_evict_first``), the TMA loads (``UTMALDG``: the TMA form's
state tiles, two where its loop is pipelined, one issued ahead of the loop), the global loads issued
before the first 16-byte one (the state tile's: how many of the small inputs' loads go ahead of it),
the asynchronous copies into shared memory (``LDGSTS``: the loads a pipelined loop issues ahead, as
replay's record walk), and a digest of the SASS without its addresses (equal digests: the same
code). The figures are this Triton's, and they move with its version: run it under the H200
image's (Triton 3.6, ``pip install triton==3.6.0`` in a virtual environment), whose counts matched
the box's own (the tune's ``regs`` column) where Triton 3.9's did not: the bf16 K=V=64 ``BV=32`` tile
takes 125 registers under 3.6 and on the H200, 96 under 3.9
(docs/triton-kernel.md, "The head counts compiled in, and where the state load sits").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.tensor_descriptor import TensorDescriptor

from kda_impls import make_inputs
from kda_impls.impls.triton.tuning import TABLE

if TYPE_CHECKING:
    from kda_impls.impls.triton.tiles import TileConfig

CONFIGS = ("BV=8,num_warps=1", "BV=16,num_warps=1", "BV=32,num_warps=1", "BV=32,num_warps=2",
           "BV=32,num_warps=1,const_heads=1", "BV=4,num_warps=1,subtiles=16",
           "BV=8,num_warps=1,programs_per_sm=8")
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
                torch.int64: "i64"}
OPTIONS = ("num_warps",)  # launch meta that are compile options, not constexprs
REGISTERS_PER_SM, PROGRAMS_PER_SM, WARPS_PER_SM = 65536, 32, 64


def assemblers() -> list[str]:
    """Triton's bundled ptxas builds first (they read the PTX this Triton writes), then CUDA's."""
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    found = [str(bundled / name) for name in ("ptxas-blackwell", "ptxas") if (bundled / name).exists()]
    for cuda in ("/usr/local/cuda/bin/ptxas", os.environ.get("TRITON_PTXAS_PATH", "")):
        if cuda and Path(cuda).exists():
            found.append(cuda)
    return found


def sass_counts(cubin: Path) -> dict:
    """SASS instructions before the first global load, and in all; the MUFU.LG2 instructions; the
    instructions from the first of the state's 16-byte loads (predicated: masked on the row's slot) to
    the last; the global loads before the first warp-wide instruction (shuffle, shared memory, barrier);
    the shuffles; the global loads and stores marked evict-first; the TMA loads; the global loads issued
    before the first 16-byte one (the state tile's: how many of the small inputs' loads go first); the
    asynchronous copies into shared memory (a pipelined loop's loads issued ahead); and a
    digest of the instructions without their addresses, equal for equal code (None without cuobjdump)."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return {"sass_before_load": None, "sass": None, "lg2": None, "state_load_spread": None,
                "loads_before_warp_wide": None, "shuffles": None, "warp_syncs": None, "evict_first_loads": None,
                "evict_first_stores": None, "tma_loads": None, "loads_before_16B": None, "async_copies": None,
                "sass_digest": None}
    sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True).stdout
    instructions = [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in sass.splitlines()
                    if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    first_load = next((i for i, line in enumerate(instructions) if "LDG" in line), None)
    loads = [line for line in instructions if re.search(r"\bLDG\.", line)]
    wide = next((i for i, line in enumerate(loads) if ".128" in line), None)
    state_loads = [i for i, line in enumerate(instructions) if re.match(r"@!?P\d+\s+LDG\.\S*128", line)]
    warp_wide = next((i for i, line in enumerate(instructions) if re.search(r"\b(SHFL|STSM|STS|LDS|LDSM|BAR)\b", line)),
                     len(instructions))
    return {"sass_before_load": first_load, "sass": len(instructions),
            "lg2": sum("MUFU.LG2" in line for line in instructions),
            "state_load_spread": state_loads[-1] - state_loads[0] if state_loads else None,
            "loads_before_warp_wide": sum(bool(re.search(r"\bLDG\.", line)) for line in instructions[:warp_wide]),
            "shuffles": sum(bool(re.search(r"\bSHFL\.", line)) for line in instructions),
            "warp_syncs": sum(bool(re.search(r"\bWARPSYNC\b", line)) for line in instructions),
            "evict_first_loads": sum(".EF." in line for line in loads),
            "evict_first_stores": sum(".EF." in line for line in instructions if re.search(r"\bSTG\.", line)),
            "tma_loads": sum("UTMALDG" in line for line in instructions), "loads_before_16B": wide,
            "async_copies": sum(bool(re.search(r"\bLDGSTS\b", line)) for line in instructions),
            "sass_digest": hashlib.sha256("\n".join(instructions).encode()).hexdigest()[:12]}


def signature(kernel, args: tuple, meta: dict) -> tuple[dict, dict, dict]:
    """Triton's (signature, constexprs, attributes) of a launch: tensors as typed pointers (16-byte
    aligned, as the pool and inputs are), tensor descriptors by their block, integers as Triton's
    launcher specialises them (1 a constant, 16-divisible ones marked so, the rest i32), floats as fp32."""
    names = [n for n in kernel.arg_names if n not in meta]
    constant = {p.name for p in getattr(kernel, "params", ()) if p.is_constexpr}  # none interpreted
    types, attrs, ones = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, args, strict=True)):
        if name in constant:  # a constexpr passed by position (frozen verify's token count)
            ones[name] = value
        elif isinstance(value, torch.Tensor):
            types[name] = "*" + TRITON_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, TensorDescriptor):  # the TMA form's view of the pool
            types[name] = f"tensordesc<{TRITON_TYPES[value.base.dtype]}{list(value.block_shape)}>"
        elif isinstance(value, float):
            types[name] = "fp32"
        elif value == 1:
            ones[name] = 1
        else:
            types[name] = "i32"
            if value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = ones | {name: value for name, value in meta.items() if name not in OPTIONS}
    types |= {name: "constexpr" for name in constexprs}
    return types, {(kernel.arg_names.index(n),): v for n, v in constexprs.items()}, attrs


def compiled_counts(kernel, args: tuple, meta: dict, num_warps: int, config: str) -> dict:
    """One launch compiled for sm_90a: its registers, spills, the warps per SM they allow and
    :func:`sass_counts`."""
    types, constexprs, attrs = signature(kernel, args, meta)
    compiled = triton.compile(ASTSource(kernel, types, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as scratch:
        ptx, cubin = Path(scratch) / "kernel.ptx", Path(scratch) / "kernel.cubin"
        ptx.write_text(compiled.asm["ptx"])
        for ptxas in assemblers():
            done = subprocess.run([ptxas, "-v", "-arch=sm_90a", str(ptx), "-o", str(cubin)], capture_output=True,
                                  text=True)
            used = re.search(r"Used (\d+) registers", done.stderr)
            if done.returncode == 0 and used:
                spills = re.search(r"(\d+) bytes spill stores", done.stderr)
                regs = int(used.group(1))
                warps = min(WARPS_PER_SM, REGISTERS_PER_SM // (regs * 32) // num_warps * num_warps,
                            PROGRAMS_PER_SM * num_warps)
                return {"config": config, "kernel": kernel.fn.__name__, "regs": regs,
                        "spill_bytes": int(spills.group(1)) if spills else 0, "warps_per_sm": warps,
                        **sass_counts(cubin)}
    raise RuntimeError(f"no ptxas here reads this Triton's PTX (tried {', '.join(assemblers()) or 'none'})")


def registers(config: TileConfig, state_dtype: torch.dtype, HV: int, D: int, B: int, T: int) -> dict:
    from kda_impls.impls.triton.kernel import launches

    inputs = make_inputs(B, HV, HV, D, D, T=T, state_dtype=state_dtype, seed=0)
    config = config.fitted(D, T)
    out = torch.empty(inputs.out_shape, dtype=inputs.v.dtype)
    kernel, _, args, meta = launches(inputs, out, config)[-1]
    return compiled_counts(kernel, args, meta, config.num_warps, str(config))


def mode_registers(mode: str, tile: str, state_dtype: torch.dtype, HV: int, D: int, B: int, T: int) -> list[dict]:
    """Each launch of a frozen-verify or replay step (``mode``, the latter on a ring of 16) under the tile
    ``tile`` (``KDA_TRITON_FROZEN_CONFIG``'s or ``KDA_TRITON_REPLAY_CONFIG``'s form; "" the default),
    compiled as the launcher would launch it."""
    from kda_impls.impls.triton.frozen import FROZEN_CONFIG_ENV
    from kda_impls.impls.triton.kernel import launches
    from kda_impls.impls.triton.replay import REPLAY_CONFIG_ENV
    from kda_impls.impls.triton.tiles import TileConfig

    os.environ[FROZEN_CONFIG_ENV if mode == "frozen" else REPLAY_CONFIG_ENV] = tile
    step = dict(update_state=False) if mode == "frozen" else dict(ring=16)
    inputs = make_inputs(B, HV, HV, D, D, T=T, state_dtype=state_dtype, seed=0, **step)
    out = torch.empty(inputs.out_shape, dtype=inputs.v.dtype)
    return [compiled_counts(kernel, args, {k: v for k, v in meta.items() if k != "num_warps"}, meta["num_warps"],
                            tile or "default")
            for kernel, _, args, meta in launches(inputs, out, TileConfig(BV=D))]


# The compiled kernel's columns, after each line's own: (heading, field of registers(), width).
COUNTS = [("regs", "regs", 4), ("spill B", "spill_bytes", 7), ("warps/SM", "warps_per_sm", 8),
          ("SASS to 1st load", "sass_before_load", 16), ("SASS", "sass", 5), ("LG2", "lg2", 4),
          ("state load spread", "state_load_spread", 17), ("loads before sync", "loads_before_warp_wide", 17),
          ("SHFL", "shuffles", 4), ("WARPSYNC", "warp_syncs", 8),
          ("EF loads", "evict_first_loads", 8),
          ("EF stores", "evict_first_stores", 9), ("TMA loads", "tma_loads", 9),
          ("loads before 16B", "loads_before_16B", 16), ("async copies", "async_copies", 12),
          ("SASS digest", "sass_digest", 12)]
COUNTS_HEADING = " ".join(f"{heading:>{width}}" for heading, _, width in COUNTS)


def counts(r: dict) -> str:
    return " ".join(f"{r[field]!s:>{width}}" for _, field, width in COUNTS)


def print_table_entries(HV: int, D: int) -> int:
    from kda_impls.impls.triton.tiles import TileConfig

    print(f"triton {triton.__version__}, sm_90a, the tuning table's entries for HV={HV} K=V={D}")
    print(f"{'state':9} {'B':>4} {'T':>2} {'config':78} {COUNTS_HEADING}")
    for (dtype, hv, K, V, B, T), text in sorted(TABLE.items()):
        if (hv, K, V) != (HV, D, D):
            continue
        r = registers(TileConfig.parse(text, TileConfig(BV=V)), getattr(torch, dtype), HV, D, B, T)
        print(f"{dtype:9} {B:4} {T:2} {r['config']:78} {counts(r)}")
    return 0


def print_mode(mode: str, args) -> int:
    print(f"triton {triton.__version__}, sm_90a, {mode}, HV={args.HV} K=V={args.D} B={args.B} T={args.T}")
    print(f"{'state':9} {mode + ' tile':32} {'kernel':24} {COUNTS_HEADING}")
    for dtype in args.state_dtypes.split(","):
        for tile in getattr(args, mode).split(";"):
            try:
                found = mode_registers(mode, "" if tile == "default" else tile, getattr(torch, dtype), args.HV,
                                       args.D, args.B, args.T)
            except RuntimeError as exc:
                print(exc)
                return 2
            for r in found:
                print(f"{dtype:9} {r['config']:32} {r['kernel']:24} {counts(r)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--configs", default=";".join(CONFIGS), help="tile configs separated by ';'")
    parser.add_argument("--state-dtypes", default="bfloat16,float32")
    parser.add_argument("--HV", type=int, default=32)
    parser.add_argument("--D", type=int, default=128, help="K = V")
    parser.add_argument("--B", type=int, default=256)
    parser.add_argument("--T", type=int, default=1)
    parser.add_argument("--frozen", metavar="TILES",
                        help="instead of --configs: frozen verify's launches under each frozen tile, separated "
                             "by ';' (KDA_TRITON_FROZEN_CONFIG's form, 'default' for none), at --T tokens")
    parser.add_argument("--replay", metavar="TILES",
                        help="instead of --configs: a replay step's launches (ring 16) under each replay tile, "
                             "separated by ';' (KDA_TRITON_REPLAY_CONFIG's form, 'default' for none), at --T tokens")
    parser.add_argument("--table", action="store_true",
                        help="instead of --configs: every entry of the tuning table for HV and K = V = D")
    args = parser.parse_args()
    if os.environ.pop("TRITON_INTERPRET", None) is not None:  # Triton's own kernels were defined interpreted
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    from kda_impls.impls.triton.tiles import TileConfig

    if args.table:
        return print_table_entries(args.HV, args.D)
    for mode in ("frozen", "replay"):
        if getattr(args, mode):
            return print_mode(mode, args)
    print(f"triton {triton.__version__}, sm_90a, HV={args.HV} K=V={args.D} B={args.B} T={args.T}")
    print(f"{'state':9} {'config':78} {'kernel':32} {COUNTS_HEADING}")
    for dtype in args.state_dtypes.split(","):
        for text in args.configs.split(";"):
            config = TileConfig.parse(text, TileConfig(BV=args.D), source="--configs")
            try:
                r = registers(config, getattr(torch, dtype), args.HV, args.D, args.B, args.T)
            except RuntimeError as exc:
                print(exc)
                return 2
            print(f"{dtype:9} {r['config']:78} {r['kernel']:32} {counts(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
