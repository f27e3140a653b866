"""Which rows of a sweep directory a run keeps and which it measures again, and why: a row is kept
when it is ok and :func:`fingerprint.changes` finds nothing that measured it changed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .. import registry
from . import fingerprint
from .config import Config

# why a configuration is measured (Plan.why); "other code" and "other settings" from fingerprint.changes
REMEASURE_REASONS = ("new", "not ok", "other code", "other settings", "fresh")


@dataclass
class Plan:
    """What a run would do: the configurations to measure, why each is (:data:`REMEASURE_REASONS`),
    how many rows of the directory are kept, and for rows measured by other code or settings what
    differs (``{"other code: naive.py changed": [row keys]}``)."""

    pending: list[Config]
    why: Counter
    kept: int
    differs: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        reasons = ", ".join(f"{self.why[r]} {r}" for r in REMEASURE_REASONS if self.why[r])
        return f"{self.kept} kept, {len(self.pending)} to measure" + (f" ({reasons})" if reasons else "")

    def why_again(self) -> str:
        """A line per difference found in rows measured by other code or settings, naming the rows."""
        return "".join(f"\n  measured again, {words}: " + (", ".join(keys) if len(keys) <= 3 else
                                                            f"{len(keys)} rows ({keys[0]}, ...)")
                       for words, keys in self.differs.items())


def plan(configs: list[Config], rows: dict[str, dict], versions: dict[str, dict], fresh: bool = False) -> Plan:
    """The :class:`Plan` for ``configs`` over the directory's ``rows`` (by key), the implementations'
    library versions now being ``versions``; with ``fresh``, every row is measured again."""
    targets = registry.implementations()
    pending, why, differs = [], Counter(), {}
    for cfg in configs:
        row = rows.get(cfg.key())
        reason = "new" if row is None else "fresh" if fresh else "not ok" if row["status"] != "ok" else None
        if reason is None:
            changed = fingerprint.changes(row.get("measured_by"), targets[cfg.impl], versions[cfg.impl])
            if changed:
                reason = changed[0]
                differs.setdefault(f"{changed[0]}: {changed[1]}", []).append(cfg.key())
        if reason:
            pending.append(cfg)
            why[reason] += 1
    return Plan(pending, why, len(configs) - len(pending), differs)
