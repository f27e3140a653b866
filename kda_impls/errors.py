"""The contract's two refusals, below every module that raises them (inputs, the contract, the harness)."""


class ContractError(ValueError):
    """Inputs that break an implementation's contract. Raised before any kernel runs."""

    def __init__(self, impl: str, rule: str, message: str):
        super().__init__(f"{impl} {message}")
        self.impl = impl
        self.rule = rule


class Unsupported(RuntimeError):
    """Valid inputs that this implementation cannot run on this machine (package, device, arch)."""
