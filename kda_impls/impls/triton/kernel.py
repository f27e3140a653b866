"""Our Triton KDA decode kernels behind the contract (``triton``): which kernel a step runs, and its launch.

A T = 1 step, in either spelling (the same memory), runs the one-token kernel (:mod:`.inplace`: one
program per tile, or the persistent form); T > 1 the multi-token kernel (:mod:`.multitoken`); frozen
verify the closed form (:mod:`.frozen`) where :func:`.frozen.frozen_tile` picks it, else the multi-token
kernel with its stores compiled out; a ``ReplayCache`` the replay kernels (:mod:`.replay`). The tile
config comes from the tuning table (:mod:`.tiles`) and is resolved, and the kernels compiled and
loaded, when the launcher is bound: the launch itself allocates, validates and compiles nothing.
"""

from __future__ import annotations

import os

import torch
import triton

from ...contract import Capabilities, Implementation
from ...inputs import DecodeInputs
from ...reference import L2_EPS, SOFTPLUS_LINEAR_ABOVE
from .frozen import frozen_launches, frozen_tile
from .gate import EVICTION_POLICY, INTERPRETED
from .inplace import _kda_decode_kernel, _kda_decode_persistent_kernel
from .multitoken import _kda_multitoken_kernel
from .replay import replay_launches
from .tiles import CONFIG_ENV, TileConfig, choose_config

HEAD_DIMS = (16, 32, 64, 128, 256)


class TritonKDA(Implementation):
    """``config``: force one tile config for every shape (tuning); None uses ``KDA_TRITON_CONFIG``
    over the tuning table."""

    name = "triton"
    library = "kda-impls"
    variant = ("one fused launch from the raw inputs (gate, sigmoid(beta) and q/k L2 norm in kernel), pool "
               "updated in place through slots; the kernel has no other calling convention")
    capabilities = Capabilities(devices=("cuda", "cpu"),
                                state_dtypes=(torch.bfloat16, torch.float16, torch.float32),
                                k_values=HEAD_DIMS, v_values=HEAD_DIMS, max_tokens=None, frozen=True, replay=True,
                                min_compute_capability=(8, 0), packages=("triton",))

    def __init__(self, config: TileConfig | None = None):
        if config is not None:
            config.validate()
        self.forced_config = config

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "triton": triton.__version__}

    def _extra_unsupported(self, inputs: DecodeInputs) -> str | None:
        interpreted = bool(INTERPRETED)
        if inputs.device.type == "cpu":
            if interpreted:
                return None
            reason = "Triton runs on CPU only under TRITON_INTERPRET=1"
            if os.environ.get("TRITON_INTERPRET"):
                return reason + ", set before kda_impls.impls.triton is imported (here it was set later)"
            if not torch.cuda.is_available():
                return reason + " (no CUDA GPU is available here)"
            return reason
        if interpreted:
            return ("TRITON_INTERPRET=1 was set when kda_impls.impls.triton was imported: the kernel would be "
                    "interpreted on the CPU, not compiled for the GPU (unset it to run on CUDA)")
        if torch.version.cuda is None:
            return "needs a CUDA build of torch (the kernel is built and tuned for NVIDIA GPUs only)"
        return None

    def config_for(self, inputs: DecodeInputs) -> TileConfig:
        """The tile config a launcher bound to ``inputs`` uses (forced, else env over table)."""
        if self.forced_config is not None:
            config = self.forced_config
        else:
            config = choose_config(inputs.state.dtype, inputs.HV, inputs.K, inputs.V, inputs.B, inputs.T)
            override = os.environ.get(CONFIG_ENV)
            if override:
                config = TileConfig.parse(override, config)
        # frozen verify's recurrence is the multi-token kernel at any T, so a T = 1 one takes its forms too
        return config.fitted(inputs.V, inputs.T if inputs.update_state else max(inputs.T, 2))

    def _launcher(self, inputs: DecodeInputs, out: torch.Tensor):
        if inputs.B == 0:
            return lambda: out
        calls = launches(inputs, out, self.config_for(inputs))
        if inputs.device.type == "cuda":
            compile_launches(inputs, calls)
        bound = [(kernel[grid], args, meta) for kernel, grid, args, meta in calls]

        def launch() -> torch.Tensor:
            for kernel, args, meta in bound:
                kernel(*args, **meta)
            return out

        return launch


def launches(inputs: DecodeInputs, out: torch.Tensor, config: TileConfig) -> list:
    """The step's launches, each ``(kernel, grid, args, meta)``: everything but the launch itself.

    A T = 1 step, in either spelling, launches the one-token kernel (its persistent form where
    ``config.programs_per_sm`` > 0: that many programs per SM, at most one per tile); T > 1 the
    multi-token one, with num_accepted (all ones allocated here where None); frozen verify the closed
    form's two launches where :func:`.frozen.frozen_tile` picks it, else the multi-token kernel
    without its stores; a replay step :func:`.replay.replay_launches`.
    """
    if inputs.replay:
        return replay_launches(inputs, out)
    if not inputs.update_state:
        tile = frozen_tile(inputs.state.dtype, inputs.HV, inputs.K, inputs.V, inputs.B, inputs.T)
        if tile is not None:
            return frozen_launches(inputs, out, tile)
    grid = (inputs.B * inputs.HV * (inputs.V // config.BV),)  # one program per tile
    one_token = inputs.T == 1 and inputs.update_state  # the one-token kernels always store
    pool = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.A_log, inputs.dt_bias, inputs.state, inputs.slots)
    scalars = (inputs.slot_stride, inputs.effective_scale)
    # The head counts are compile-time constants (the one-token kernel's unless config.const_heads is
    # 0): the program-to-tile mapping divides by them, and a division by a runtime value is a long
    # instruction sequence on the path to the first load.
    meta = dict(HV=inputs.HV, GROUP=inputs.HV // inputs.H, K=inputs.K, V=inputs.V, BV=config.BV, L2_EPS=L2_EPS,
                SOFTPLUS_LINEAR_ABOVE=SOFTPLUS_LINEAR_ABOVE, FAST_GATE=config.fast_gate,
                STORE_HINT=EVICTION_POLICY[config.store_evict_first],
                LOAD_HINT=EVICTION_POLICY[config.load_evict_first], num_warps=config.num_warps)
    if one_token and config.programs_per_sm:
        n_tiles = grid[0]
        programs = min(n_tiles, config.programs_per_sm * multiprocessors(inputs.device))
        return [(_kda_decode_persistent_kernel, (programs,), (*pool, out, *scalars, n_tiles),
                 meta | dict(LOOKAHEAD=config.lookahead))]
    if one_token:
        heads = (meta.pop("HV"), meta.pop("GROUP"))
        constants = heads if config.const_heads else (0, 0)
        return [(_kda_decode_kernel, (grid[0] // config.subtiles,), (*pool, out, *scalars, *heads),
                 meta | dict(HV_CONST=constants[0], GROUP_CONST=constants[1], SUBTILES=config.subtiles,
                             STATE_FIRST=config.state_first, REWIDEN=config.rewiden,
                             TILED_INPUTS=config.tiled_inputs))]
    return [(_kda_multitoken_kernel, grid, (*pool, inputs.accepted(), out, *scalars, inputs.T),
             meta | dict(STORES=int(inputs.update_state)))]


def multiprocessors(device: torch.device) -> int:
    """SMs of a CUDA device; 1 on the CPU (the interpreter), where a persistent grid is then
    ``programs_per_sm`` programs walking every tile."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def compile_launches(inputs: DecodeInputs, calls: list) -> list:
    """Compile (or fetch from Triton's cache) and load the CUDA kernels of ``calls`` (:func:`launches`);
    returns Triton's compiled kernels (``n_regs``, ``n_spills``, ``metadata``). Done at bind time so that
    neither the first timed launch nor a CUDA-graph capture compiles or loads a module."""
    compiled = []
    with torch.cuda.device(inputs.device):
        for kernel, grid, args, meta in calls:
            compiled.append(kernel.warmup(*args, grid=grid, **meta))
            compiled[-1]._init_handles()  # the module load Triton would otherwise do at the first launch
    return compiled
