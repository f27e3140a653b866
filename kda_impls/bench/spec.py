"""What a sweep measures and how, as one value: :class:`SweepSpec`. ``kda-sweep`` builds it from argv,
:func:`kda_impls.sweep` from Python values; either way it is checked here, once, before anything is
written or measured, and its defaults live here."""

from __future__ import annotations

import argparse
import numbers
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .. import dtypes, registry
from ..cli import UsageError, devices
from ..input_rules import shape_violation
from .case import Method
from .config import AXES, CHECKPOINTS, MODES, SLOT_ORDERS, Config, PoolLayout
from .l2 import DEFAULT_ENTRY, ENTRY_STATES
from .presets import PRESETS, Preset, adhoc_configs
from .timing import Budget

# settings that change neither which rows are measured nor how: left out of the default directory's name
NOT_SETTINGS = {"out", "charts", "dry_run", "fresh", "baseline", "row_timeout", "cooldown", "devices", "preset",
                "repro", "import_extras"}
POSITIVE_AXES = ("B", "H", "HV", "K", "V", "T", "ring")


class SettingError(UsageError):
    """A refused setting: ``field`` names it (``state_dtype``), the message says what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def _values(field: str, value) -> tuple:
    """A value or a list of them as a tuple without repeats (a comma-separated string split)."""
    if isinstance(value, str):
        value = [item.strip() for item in value.split(",")]
        if not all(value):
            raise SettingError(field, f"{','.join(value)!r} is not a comma-separated list of values")
    items = tuple(value) if isinstance(value, (list, tuple, set, range)) else (value,)
    if not items:
        raise SettingError(field, "an empty list; give at least one value")
    return tuple(dict.fromkeys(items))


def _whole(field: str, value, low: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SettingError(field, f"{value!r} is not a whole number") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SettingError(field, f"{value!r} is not a whole number")
    if value < low:
        raise SettingError(field, f"{value} must be a whole number >= {low}")
    return int(value)


def _number(field: str, value, low: float, strict: bool) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingError(field, f"{value!r} is not a number") from None
    if isinstance(value, bool) or not (number > low if strict else number >= low):
        raise SettingError(field, f"{value} must be a number {'>' if strict else '>='} {low:g}")
    return number


def _choice(field: str, value, choices) -> str:
    if value not in choices:
        raise SettingError(field, f"{value!r} is not one of {', '.join(choices)}")
    return value


def _dtype(value) -> str:
    try:
        return dtypes.full(dtypes.dtype_name(value))  # torch.bfloat16, "bf16" or "bfloat16"
    except ValueError as exc:
        raise SettingError("state_dtype", str(exc)) from None


def _shard(value) -> tuple[int, int]:
    """``"i/n"`` or ``(i, n)`` as ``(i, n)``."""
    parts = value.split("/") if isinstance(value, str) else value
    try:
        i, n = (int(part) for part in parts)
    except (TypeError, ValueError):
        i = n = -1
    if not 0 <= i < n:
        raise SettingError("shard", f"{value!r} is not i/n with 0 <= i < n (e.g. 0/2 and 1/2)")
    return i, n


@dataclass(frozen=True)
class SweepSpec:
    """One sweep: which rows (a preset and/or axes, implementations, a shard), how each is timed, and
    where the results go. An axis left None takes the preset's values (or Kimi-Linear's layer for an
    ad-hoc grid); a value may be one item or a list; ``state_dtype`` takes torch dtypes or their
    names. Every field is checked and normalised when the spec is made (:class:`SettingError`)."""

    preset: str | None = None
    impls: tuple[str, ...] | None = None  # None: every registered implementation
    B: tuple[int, ...] | None = None
    H: tuple[int, ...] | None = None
    HV: tuple[int, ...] | None = None
    K: tuple[int, ...] | None = None
    V: tuple[int, ...] | None = None
    state_dtype: tuple[str, ...] | None = None
    slot_pad: tuple[int, ...] | None = None
    pad_rows: tuple[int, ...] | None = None
    T: tuple[int, ...] | None = None
    checkpoints: tuple[str, ...] | None = None
    mode: tuple[str, ...] | None = None
    ring: tuple[int, ...] | None = None
    slots_per_row: int = PoolLayout.slots_per_row
    slot_order: str = PoolLayout.slot_order
    placements: int | None = None  # None: PoolLayout's on a GPU, 1 on the CPU
    extra_placements: int = Method.extra_placements
    disjoint_placements: bool = Method.disjoint_placements
    settle: float = Method.settle_s
    placement_processes: int | None = None  # None: the preset's on a GPU, 1 on the CPU
    l2_entry: str = DEFAULT_ENTRY
    min_samples: int | None = None
    max_seconds: float | None = None
    cooldown: float = 0.0
    retime: bool = True
    devices: tuple[str, ...] | str = "all"
    shard: tuple[int, int] | None = None
    out: Path | None = None
    row_timeout: float = 600.0
    fresh: bool = False
    dry_run: bool = False
    charts: bool = True
    repro: bool = False
    baseline: str | None = None
    # False: each extra implementation ($KDA_EXTRA_IMPLS) is imported only by the workers that measure it
    # (kda-ab's sides, each from its own tree), not here
    import_extras: bool = True

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        if self.preset is not None:
            _choice("preset", self.preset, list(PRESETS))
        if self.impls is not None:
            set_("impls", tuple(str(name).strip() for name in _values("impls", self.impls)))
        for axis in AXES:
            value = getattr(self, axis)
            if value is None:
                continue
            items = _values(axis, value)
            if axis in POSITIVE_AXES or axis in ("slot_pad", "pad_rows"):
                items = tuple(_whole(axis, v, 1 if axis in POSITIVE_AXES else 0) for v in items)
            elif axis == "state_dtype":
                items = tuple(dict.fromkeys(_dtype(v) for v in items))
            else:
                items = tuple(_choice(axis, v, CHECKPOINTS if axis == "checkpoints" else MODES) for v in items)
            set_(axis, items)
        for name, low in (("slots_per_row", 1), ("extra_placements", 0)):
            set_(name, _whole(name, getattr(self, name), low))
        for name in ("placements", "placement_processes", "min_samples"):
            if getattr(self, name) is not None:
                set_(name, _whole(name, getattr(self, name), 1))
        for name in ("disjoint_placements", "retime", "fresh", "dry_run", "charts", "repro", "import_extras"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(name, f"{getattr(self, name)!r} is not True or False")
        _choice("slot_order", self.slot_order, SLOT_ORDERS)
        _choice("l2_entry", self.l2_entry, list(ENTRY_STATES))
        set_("settle", _number("settle", self.settle, 0, strict=False))
        set_("cooldown", _number("cooldown", self.cooldown, 0, strict=False))
        set_("row_timeout", _number("row_timeout", self.row_timeout, 0, strict=True))
        if self.max_seconds is not None:
            set_("max_seconds", _number("max_seconds", self.max_seconds, 0, strict=True))
        if self.shard is not None:
            set_("shard", _shard(self.shard))
        if self.out is not None:
            set_("out", Path(self.out))
        text = self.devices if isinstance(self.devices, str) else ",".join(map(str, self.devices))
        try:
            set_("devices", tuple(devices(text)))
        except argparse.ArgumentTypeError as exc:
            raise SettingError("devices", str(exc)) from None
        self._check_impls()

    def _check_impls(self) -> None:
        """Refuse unknown names and, of $KDA_EXTRA_IMPLS, an entry that is malformed or, of those this
        spec runs, one that does not import (where ``import_extras``)."""
        extra = extra_impls()
        unknown = [name for name in self.impls or () if name not in registry.names()]
        if unknown:
            raise UsageError(f"unknown implementations {', '.join(unknown)}; registered: {', '.join(registry.names())}")
        if not self.import_extras:
            return
        for name in [n for n in self.impls if n in extra] if self.impls is not None else extra:
            try:
                registry.get(name)
            except Exception as exc:
                raise UsageError(f"{registry.EXTRA_IMPLS_ENV}: {name}={extra[name]} does not import here "
                                 f"({type(exc).__name__}: {exc}); fix the variable or leave {name} out") from None

    @property
    def device_type(self) -> str:
        return "cuda" if self.devices[0].startswith("cuda") else "cpu"

    @property
    def name(self) -> str:
        """The preset's name, ``adhoc`` for axes alone, or the device's default preset."""
        if self.preset is None and any(getattr(self, axis) is not None for axis in AXES):
            return "adhoc"
        return self.preset or ("kimi-linear-48b" if self.device_type == "cuda" else "smoke")

    def configs(self) -> list[Config]:
        """The rows, this shard's of them; :class:`UsageError` for a grid that is empty or breaks a rule
        of the contract on sizes (HV % H, pad_rows <= B)."""
        # a CPU's timings model no placement (they smoke-test the harness): one there unless asked for more
        placements = self.placements or (1 if self.device_type == "cpu" else PoolLayout.placements)
        layout = PoolLayout(slots_per_row=self.slots_per_row, slot_order=self.slot_order, placements=placements)
        given = {axis: getattr(self, axis) for axis in AXES if getattr(self, axis) is not None}
        impls = list(self.impls or registry.names())
        try:
            configs = (adhoc_configs(impls, given, layout) if self.name == "adhoc"
                       else PRESETS[self.name].configs(impls, layout, only=given))
        except ValueError as exc:  # a combination a Config refuses (mode replay without a ring, ...)
            raise UsageError(str(exc)) from None
        if self.ring and not any(c.mode == "replay" for c in configs):
            raise UsageError(f"--ring {','.join(map(str, self.ring))}: no replay row of {self.name} has that ring "
                             "(--ring sets the rings of mode replay's rows: add --mode replay, or inplace,replay, "
                             "or leave --ring out)")
        if not configs:
            raise UsageError(f"the axes given leave no configuration of preset {self.name}")
        for cfg in configs:
            broken = shape_violation(cfg.B, cfg.H, cfg.HV, cfg.pad_rows)
            if broken:
                raise UsageError(f"{broken[1]} (the contract's rule {broken[0]!r})")
        if self.baseline and self.baseline not in {c.impl for c in configs}:
            raise UsageError(f"--baseline {self.baseline} is not among this run's implementations "
                             f"({', '.join(dict.fromkeys(c.impl for c in configs))})")
        if self.shard:
            index, count = self.shard
            configs = configs[index::count]
            if not configs:
                raise EmptyShard(f"shard {index}/{count} of this grid holds no rows")
        return configs

    def method(self, device_type: str | None = None) -> Method:
        """How rows are timed on ``device_type`` (default: the spec's devices'): the preset's budgets
        unless the spec narrows them, and the preset's placement processes on a GPU unless
        ``placement_processes`` says otherwise."""
        device_type = device_type or self.device_type
        preset: Preset = PRESETS.get(self.name, PRESETS["published"])
        kernel = Budget(min_samples=self.min_samples or preset.kernel.min_samples,
                        max_samples=max(preset.kernel.max_samples, self.min_samples or 0),
                        max_seconds=self.max_seconds or preset.kernel.max_seconds, rel_ci=preset.kernel.rel_ci)
        processes = self.placement_processes or (
            preset.placement_processes if device_type == "cuda" else Method.placement_processes)
        return Method(entry=self.l2_entry, kernel=kernel, call=preset.call, extra_placements=self.extra_placements,
                      disjoint_placements=self.disjoint_placements, settle_s=self.settle,
                      placement_processes=processes, retime_throttled=self.retime)

    def is_plain(self) -> bool:
        """Whether this is a preset as it is: every implementation, every setting at its default."""
        default = replace(SweepSpec(devices=self.devices), preset=self.preset)
        return self.name != "adhoc" and all(getattr(self, f.name) == getattr(default, f.name)
                                            for f in fields(self) if f.name not in NOT_SETTINGS)


class EmptyShard(UsageError):
    """A shard of the grid that holds no rows: nothing to do, and not an error."""


def extra_impls() -> dict[str, str]:
    """$KDA_EXTRA_IMPLS's entries; a malformed one is a :class:`UsageError` saying how to fix it."""
    try:
        return registry.extra_impls()
    except ValueError as exc:
        raise UsageError(f"{exc}; set it to name=module:Class[,name=module:Class] or unset it") from None
