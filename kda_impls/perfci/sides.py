"""The driver's handle on one side's worker (:mod:`.side`): a process started with the side's tree first
on PYTHONPATH, kept warm across rounds, started again after a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from ..bench.case import Method, empty_row
from ..bench.config import Config
from .revisions import Side

SIDE_SCRIPT = Path(__file__).with_name("side.py")
STARTUP_TIMEOUT_S = 600.0


class SideDied(Exception):
    pass


def side_environment(side: Side, extra: dict[str, str]) -> dict[str, str]:
    """The worker's environment: the side's commit for its rows, ``extra`` on top, and the side's tree
    first on PYTHONPATH (before the rest of it, ``extra``'s or this process's: implementations registered
    from outside the tree)."""
    rest = extra.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    git = {"KDA_GIT_SHA": side.sha, "KDA_GIT_DIRTY": "1" if side.dirty else "0"} if side.sha else {}
    return {**os.environ, **git, **extra, "PYTHONPATH": os.pathsep.join(filter(None, [str(side.tree), rest]))}


def known(values: dict, fields: list[str]) -> dict:
    """``values`` less the fields a side's harness does not have (``ab.check_fields`` has refused any
    of them that is not at its default)."""
    return {k: v for k, v in values.items() if k in fields}


class SideWorker:
    """One side's worker process on ``device``."""

    def __init__(self, side: Side, device: str, env: dict[str, str]):
        self.side, self.device, self.env = side, device, env
        self.process: subprocess.Popen | None = None
        self.hello: dict = {}
        self.described: dict[str, dict] = {}

    def start(self) -> dict:
        """Start the worker (if it is not running) and return its hello."""
        if self.process is None:
            self.process = subprocess.Popen([sys.executable, str(SIDE_SCRIPT), self.device], cwd=self.side.tree,
                                            env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.hello = self._receive(STARTUP_TIMEOUT_S)
        return self.hello

    def _receive(self, timeout: float) -> dict:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            self.stop(now=True)
            raise SideDied(f"no answer within {timeout:g} s; worker killed" if not result else
                           f"worker exited with code {self.process.returncode if self.process else '?'}")
        return json.loads(result[0])

    def measure(self, cfg: Config, method: Method, copy_bw: float, timeout: float) -> dict:
        """The row of ``cfg`` from this side's tree; a crashed row where the worker died (it starts
        again at the next call)."""
        try:
            self.start()
            config, settings = (known(asdict(x), self.hello[f"{kind}_fields"])
                                for x, kind in ((cfg, "config"), (method, "method")))
            self.process.stdin.write(json.dumps({"config": config, "method": settings, "copy_bw": copy_bw}) + "\n")
            self.process.stdin.flush()
            answer = self._receive(timeout)
        except (SideDied, OSError) as exc:
            self.stop(now=True)
            return empty_row(cfg, "crashed", f"{self.side.label} worker: {exc}")
        if answer.get("describe"):
            self.described[cfg.impl] = answer["describe"]
        if answer["row"]["status"] == "crashed":
            self.stop(now=True)
        return answer["row"]

    def stop(self, now: bool = False) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if not now and process.poll() is None:
            try:
                process.stdin.write("\n")
                process.stdin.flush()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
