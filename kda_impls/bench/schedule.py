"""Which rows a device's lane measures next: rows in compile groups (one implementation's rows of one
shape), and a scheduler that keeps each lane to the implementations it has started."""

from __future__ import annotations

import threading
from collections import deque

from .config import Config


def compile_groups(configs: list[Config]) -> list[list[Config]]:
    """``configs`` in groups a lane measures together, in order of first appearance: one
    implementation's rows of one shape, state dtype, tokens per row and mode (frozen verify is a
    kernel of its own), which differ in batch size, padding and pool layout. A kernel specialised on
    the shape is compiled once per worker, and a compiler without a cache on disk compiles it again
    in every process; most of a library's first-call cost is per process, not per shape, so the
    groups go to lanes by implementation (:class:`GroupScheduler`)."""
    groups: dict[tuple, list[Config]] = {}
    for cfg in configs:
        groups.setdefault(group_key(cfg), []).append(cfg)
    return list(groups.values())


def group_key(cfg: Config) -> tuple:
    """What a compiled kernel is specialised on: the implementation, shape, state dtype, T, mode and ring."""
    return cfg.impl, cfg.H, cfg.HV, cfg.K, cfg.V, cfg.state_dtype, cfg.T, cfg.mode, cfg.ring


class GroupScheduler:
    """Which compile group a free lane measures next: the next group of an implementation the lane
    has started; else, of the implementations no lane has started, the one with the most rows left
    (the longest first, so that the last ones even the lanes out); else the last group of the
    implementation with the most rows left on another lane. A library's first call in a process
    costs seconds whatever the shape (FlashInfer's CuTe DSL variants: 8.1-14.3 s each on one H200
    lane), so a lane takes another lane's implementation only when nothing else is left. Thread-safe:
    lanes call :meth:`next` from their threads."""

    def __init__(self, groups: list[list[Config]]):
        self._left: dict[str, deque[list[Config]]] = {}
        for group in groups:
            self._left.setdefault(group[0].impl, deque()).append(group)
        self._lanes: dict[str, set[str]] = {}  # implementation -> the lanes that have started it
        self._lock = threading.Lock()

    def _rows_left(self, impl: str) -> int:
        return sum(len(group) for group in self._left[impl])

    def next(self, lane: str) -> list[Config] | None:
        with self._lock:
            waiting = [impl for impl, groups in self._left.items() if groups]
            own = [impl for impl in waiting if lane in self._lanes.get(impl, ())]
            if own:
                return self._left[own[0]].popleft()
            if not waiting:
                return None
            fresh = [impl for impl in waiting if impl not in self._lanes]
            impl = max(fresh or waiting, key=self._rows_left)  # max keeps the first of equals
            self._lanes.setdefault(impl, set()).add(lane)
            return self._left[impl].popleft() if fresh else self._left[impl].pop()
