"""A sweep directory on disk: one JSON file per finished row, assembled into results.csv and
samples.json, and meta.json about the machine and the runs; and :func:`load`, the one reader of such a
directory (the gate, the charts, the targets report and the published comparison use it).

Every file is replaced whole (:func:`atomic_write`), so a sweep killed at any instant leaves each file
either as it was or complete; rows/ is the record that resuming reads.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from . import clocks
from .case import COLUMNS
from .config import CONFIG_COLUMNS, SORT_COLUMNS

SAMPLE_FILES = {"samples.json": "kernel_samples_us", "call_samples.json": "call_samples_us",
                "placements.json": "kernel_placement_us"}
# Sample files keep microseconds to this many decimals (0.1 ns, far below what CUDA events resolve):
# full float digits made a two-GPU `targets` run's samples.json 2.4 MB, past what a repo should carry.
SAMPLE_DECIMALS = 4
# What measured a row: the commit (and whether the tree differed from it) and the fingerprint of its
# code and settings (fingerprint.digest); results.csv carries them after the case runner's columns
PROVENANCE = ["commit", "dirty", "fingerprint"]
REPO = Path(__file__).resolve().parents[2]


def _file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file here (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` all at once: write a temporary file beside it, then os.replace.

    A reader, or a later run after a SIGKILL, sees the old file or the new one, never a mix. (No
    fsync: a killed process's writes survive in the page cache; only a power cut could lose them.)
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, _file_mode())  # mkstemp's 0600 would make results unlike the charts beside them
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(out_dir: Path) -> None:
    """Temporaries a SIGKILL left between write and rename."""
    for tmp in [*out_dir.glob(".*.tmp"), *(out_dir / "rows").glob(".*.tmp")]:
        tmp.unlink(missing_ok=True)


def write_row(out_dir: Path, row: dict) -> None:
    rows = out_dir / "rows"
    rows.mkdir(parents=True, exist_ok=True)
    atomic_write(rows / f"{row['key']}.json", json.dumps(row))


def read_rows(out_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(out_dir) / "rows").glob("*.json"))]


def rounded_samples(samples: dict[str, list]) -> dict[str, list]:
    """``{key: microseconds}`` with each value kept to :data:`SAMPLE_DECIMALS` decimals (None, a
    failed sample, stays None)."""
    return {key: [None if x is None else round(x, SAMPLE_DECIMALS) for x in values] for key, values in samples.items()}


def assemble(out_dir: Path) -> pd.DataFrame:
    """Write results.csv (one row per implementation x configuration, :data:`COLUMNS` and
    :data:`PROVENANCE`) from rows/,
    and the raw samples in microseconds keyed by the row's key: samples.json (kernel time, what the
    regression gate tests), call_samples.json (one eager call) and placements.json (the kernel time's
    per-placement medians, what the gate's placement test reads)."""
    rows = read_rows(out_dir)
    for name, column in SAMPLE_FILES.items():
        atomic_write(out_dir / name, json.dumps(rounded_samples({row["key"]: row.get(column) or [] for row in rows})))
    table = pd.DataFrame(rows, columns=[*COLUMNS, *PROVENANCE]).sort_values(SORT_COLUMNS, ignore_index=True)
    atomic_write(out_dir / "results.csv", table.to_csv(index=False))
    return table


def _command(*args: str) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(out_dir: Path) -> dict:
    """The checkout's commit, and whether tracked or untracked files differ from it (the sweep's own
    output directory excepted); or what KDA_GIT_SHA (and KDA_GIT_DIRTY) say, when set.

    The variables win over a ``.git`` that is there: a lent GPU box receives a copy of the working
    tree without its history, or with a stale ``.git`` from an earlier copy, whose HEAD is another
    commit than the tree (the rows would name an earlier commit, "dirty", for a clean one).
    """
    if os.environ.get("KDA_GIT_SHA"):
        dirty = os.environ.get("KDA_GIT_DIRTY")
        return {"sha": os.environ["KDA_GIT_SHA"], "dirty": None if dirty is None else dirty == "1",
                "source": "environment (KDA_GIT_SHA, KDA_GIT_DIRTY)"}
    exclude = []
    if Path(out_dir).resolve().is_relative_to(REPO):
        exclude = [f":(exclude){Path(out_dir).resolve().relative_to(REPO)}"]
    sha = _command("git", "rev-parse", "HEAD")
    if sha is None:
        return {"sha": None, "dirty": None, "source": "no git history here and KDA_GIT_SHA unset"}
    status = _command("git", "status", "--porcelain", "--", ".", *exclude)
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def device_info(device: torch.device) -> dict:
    if device.type != "cuda":
        cpuinfo = Path("/proc/cpuinfo")
        lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
        name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                    platform.machine())
        return {"type": "cpu", "name": name, "cpu_count": os.cpu_count()}
    props = torch.cuda.get_device_properties(device)
    # the UUID names the physical GPU (its index is relative to CUDA_VISIBLE_DEVICES, nvidia-smi's is not)
    uuid = f"GPU-{props.uuid}"
    return {
        "type": "cuda", "name": props.name, "uuid": uuid, "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count, "l2_bytes": props.L2_cache_size, "memory_bytes": props.total_memory,
        "driver": _command("nvidia-smi", f"--id={uuid}", "--query-gpu=driver_version", "--format=csv,noheader"),
        "cuda": torch.version.cuda,
    }


def environment(device: torch.device, out_dir: Path, command: str) -> dict:
    """Where and from what a measurement came: device (and its power limit and clocks), host,
    commit, command and the ``KDA_*`` variables it ran under (a forced Triton tile config changes
    every Triton row without showing in the command), UTC time."""
    info = device_info(device)
    return {"gpu": info["name"], "device": info, "gpu_limits": clocks.gpu_limits(device), "host": platform.node(),
            "git": git_state(out_dir), "command": command,
            "environment": {name: value for name, value in sorted(os.environ.items()) if name.startswith("KDA_")},
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def read_meta(out_dir: Path) -> dict:
    path = Path(out_dir) / "meta.json"
    return json.loads(path.read_text()) if path.exists() else {}


def write_meta(out_dir: Path, meta: dict) -> None:
    atomic_write(Path(out_dir) / "meta.json", json.dumps(meta, indent=2, sort_keys=True))


class SweepDirError(ValueError):
    """A path that is not a readable sweep directory; the message names the file and what is wrong."""


@dataclass
class Sweep:
    """A sweep directory as read back: the results table, meta.json, and the raw kernel-time samples
    and per-placement medians (microseconds) by row key."""

    path: Path
    table: pd.DataFrame
    meta: dict
    samples: dict[str, list[float]]
    placements: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ok(self) -> pd.DataFrame:
        """The rows that matched the reference and were timed."""
        return self.table[(self.table.status == "ok") & self.table.kernel_us_mean.notna()]


def best_per_library(ok: pd.DataFrame) -> pd.DataFrame:
    """Of each library's implementations (its call variants), the fastest ok row per configuration:
    one row per library and configuration, ``impl`` naming the variant that won. Rows without a
    library (older sweeps) count as their own library."""
    config = [c for c in CONFIG_COLUMNS if c != "impl"]
    ranked = ok.assign(library=ok.library.fillna(ok.impl)).sort_values("kernel_us_mean")
    return ranked.drop_duplicates(["library", *config]).sort_values(["library", *config], ignore_index=True)


def _read_json(path: Path, default):
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SweepDirError(f"{path}: not valid JSON, empty or cut short ({exc})") from None


def kernel_time_words(meta: dict) -> str:
    """What a sweep directory's kernel time is, in words for a report: the mean over placements
    (timing method 4 on), or their median (the methods before it)."""
    return "mean over placements" if meta["settings"]["method"]["version"] >= 4 else "median over placements"


def load(path: str | Path) -> Sweep:
    """Read the sweep directory ``path`` (results.csv, meta.json, samples.json, placements.json)."""
    path = Path(path)
    if not path.is_dir():
        raise SweepDirError(f"{path}: no such directory (a sweep directory holds results.csv and meta.json)")
    csv = path / "results.csv"
    if not csv.exists():
        raise SweepDirError(f"{csv}: missing; {path} is not a sweep directory (or its sweep never finished a row: "
                            f"run the sweep again to resume)")
    try:
        table = pd.read_csv(csv)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
        raise SweepDirError(f"{csv}: empty or cut short ({exc}); run the sweep again to rebuild it from rows/"
                            ) from None
    missing = [c for c in ("impl", "key", "status", "kernel_us_mean") if c not in table.columns]
    if missing:
        raise SweepDirError(f"{csv}: not a sweep's results (no column {', '.join(missing)})")
    return Sweep(path, table, _read_json(path / "meta.json", {}),
                 _read_json(path / "samples.json", {}), _read_json(path / "placements.json", {}))
