"""Interchangeable KDA (Kimi Delta Attention) decode implementations behind one checked contract."""

from .contract import Capabilities, ContractError, Implementation, Unsupported
from .engine import from_engine
from .inputs import DecodeInputs, make_inputs
from .reference import effective_state, reference
from .registry import get, names
from .replay import ReplayCache
from .verify import Verdict, rel_err, verify

__all__ = [
    "Capabilities", "ContractError", "DecodeInputs", "Implementation", "ReplayCache", "SweepSpec", "Unsupported",
    "Verdict", "effective_state", "from_engine", "get", "make_inputs", "names", "reference", "rel_err", "sweep",
    "verify",
]


def __getattr__(name: str):
    """``sweep`` and ``SweepSpec`` load the harness (pandas, the driver) on first use, not with the package."""
    if name in ("sweep", "SweepSpec"):
        from .bench import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
