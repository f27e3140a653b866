"""The contract's shape rules: which spelling the inputs use (one token per row, or a token axis), and
each dimension's size by vote, so that the tensor that disagrees is the one blamed."""

from __future__ import annotations

from collections import Counter
from typing import Callable, NoReturn

from . import replay
from .inputs import DecodeInputs

Fail = Callable[[str, str], NoReturn]  # fail(rule, message): raises the implementation's ContractError

# The per-row tensors in both spellings, by the dimension each axis carries.
_ONE_TOKEN_LAYOUTS = {"q": ("B", "H", "K"), "k": ("B", "H", "K"), "v": ("B", "HV", "V"), "a": ("B", "HV", "K"),
                      "b": ("B", "HV"), "slots": ("B",)}
_PER_TOKEN_LAYOUTS = {name: layout[:1] + ("T",) + layout[1:] for name, layout in _ONE_TOKEN_LAYOUTS.items()}
_ONE_TOKEN_RANKS = {name: len(layout) for name, layout in _ONE_TOKEN_LAYOUTS.items()}


def _spell(layout: tuple[str, ...]) -> str:
    return "[" + ", ".join(layout) + "]"


def check_mode(x: DecodeInputs, fail: Fail) -> None:
    """update_state, cache and num_accepted name one decode mode."""
    if not isinstance(x.update_state, bool):
        fail("update-state", f"update_state must be a bool (True: the pool is updated in place; False: "
                             f"frozen verify); got {x.update_state!r}")
    if x.cache is not None and not isinstance(x.cache, replay.ReplayCache):
        fail("cache", f"cache must be a kda_impls.ReplayCache (replay) or None; got {type(x.cache).__name__}")
    if x.replay and not x.update_state:
        fail("update-state", "update_state must be True with a cache (a replay step writes its records); "
                             "got False")
    if not x.update_state and x.num_accepted is not None:
        fail("num-accepted", "num_accepted must be None when update_state=False (frozen verify starts row i "
                             f"from slots[i] and stores nothing); got a tensor of shape "
                             f"{tuple(x.num_accepted.shape)}")


def check_shapes(x: DecodeInputs, fail: Fail) -> None:
    """The mode, then every tensor's rank and shape: one spelling, one size per dimension."""
    check_mode(x, fail)
    # The spelling (one token per row, or a token axis) is the one most of q, k, v, a, b and
    # slots use, and each dimension the value most of the tensors that carry it agree on: a
    # tensor that disagrees is then blamed itself, never a consistent one derived from it.
    # Frozen verify's and replay's slots are [B] in both spellings, so they cast no vote.
    voters = {n: r for n, r in _ONE_TOKEN_RANKS.items() if not x.one_slot_per_row or n != "slots"}
    per_token = sum(getattr(x, n).dim() == r + 1 for n, r in voters.items()) > \
        sum(getattr(x, n).dim() == r for n, r in voters.items())
    layouts = _PER_TOKEN_LAYOUTS if per_token else _ONE_TOKEN_LAYOUTS
    if x.one_slot_per_row:
        layouts = {**layouts, "slots": ("B",)}
    expected = {**layouts, "A_log": ("HV",), "state": ("N", "HV", "V", "K")}
    if x.num_accepted is not None:
        expected["num_accepted"] = ("B",)
    for name in (*layouts, "state"):
        t, layout = getattr(x, name), expected[name]
        if t.dim() != len(layout):
            mode = "replay: row i's state is slot slots[i]'s" if x.replay else \
                "update_state=False: row i reads slot slots[i], nothing is stored"
            frozen = f" ({mode})" if name == "slots" and x.one_slot_per_row else ""
            fail("rank", f"{name} must be {len(layout)}-D {_spell(layout)}{frozen}; got shape "
                         f"{tuple(t.shape)}")
    # Every tensor of the right rank votes; dt_bias as [HV, K] (its flat [HV*K] is checked below).
    votes: dict[str, list[int]] = {}
    for name, layout in {**expected, "dt_bias": ("HV", "K")}.items():
        t = getattr(x, name)
        if t.dim() == len(layout):
            for i, dim in enumerate(layout):
                votes.setdefault(dim, []).append(t.shape[i])
    # most common first; a tie goes to the tensor listed first (q before k, v before state)
    dims = {dim: Counter(sizes).most_common(1)[0][0] for dim, sizes in votes.items()}
    agreed = ", ".join(f"{d}={dims[d]}" for d in ("B", "T", "H", "HV", "K", "V") if d in dims)
    for name, layout in expected.items():
        got = tuple(getattr(x, name).shape)
        shape = tuple(dims[d] for d in layout)
        if got != shape:
            fail("shape", f"{name} shape must be {shape} ({_spell(layout)} with {agreed}, as most "
                          f"inputs agree); got {got}")
    HV, K = dims["HV"], dims["K"]
    if tuple(x.dt_bias.shape) not in ((HV, K), (HV * K,)):
        fail("shape", f"dt_bias shape must be [HV, K]=({HV}, {K}) or [HV*K]=({HV * K},); "
                      f"got {tuple(x.dt_bias.shape)}")
    if x.H == 0 or HV % x.H:
        fail("gva", f"HV must be a multiple of H; got HV={HV}, H={x.H} "
                    f"(value head hv reads q/k head hv // (HV // H))")
    if x.replay:
        for rule, message in replay.violations(x, dims):
            fail(rule, message)
