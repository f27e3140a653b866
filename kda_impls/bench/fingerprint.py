"""What measured a row, recorded so that a resumed sweep keeps only rows that the code and settings
of now would measure the same way.

A worker records, after each row (:func:`record`): the implementation's ``module:Class``; the source
of every module it has loaded that is not part of the Python installation (this package, the
implementation's own package or files, any code beside them), plus the data files in the packages of
those modules (tuning tables), each as a path relative to its import root and a hash; the ``KDA_*``
variables that reach a kernel; and the library versions. The driver (:func:`changes`) hashes the
same files again where they resolve now and names what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import site
import sys
import sysconfig
from functools import cache
from pathlib import Path

# KDA_* variables that say where a row came from or which implementations exist, not how one runs
NOT_KERNEL_SETTINGS = {"KDA_EXTRA_IMPLS", "KDA_GIT_SHA", "KDA_GIT_DIRTY"}
PACKAGE = Path(__file__).resolve().parents[1]  # kda_impls/
SOURCE_SUFFIXES = {".py", ".pyc"}
_hashes: dict[Path, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, digest): a worker hashes a file once


def kernel_settings() -> dict[str, str]:
    """The ``KDA_*`` environment variables that can change what a kernel does (a forced tile config)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("KDA_") and k not in NOT_KERNEL_SETTINGS}


def file_hash(path: Path) -> str | None:
    """16 hex digits of the file's bytes; None where it cannot be read."""
    try:
        stat = path.stat()
        known = _hashes.get(path)
        if known and known[:2] == (stat.st_mtime_ns, stat.st_size):
            return known[2]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None
    _hashes[path] = (stat.st_mtime_ns, stat.st_size, digest)
    return digest


@cache
def _installation() -> tuple[Path, ...]:
    """Where the interpreter and installed libraries live (their versions speak for them)."""
    paths = sysconfig.get_paths()
    found = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    found += [*site.getsitepackages(), site.getusersitepackages()]
    return tuple(dict.fromkeys(Path(p).resolve() for p in found))


def _root_of(name: str, file: Path) -> Path:
    """The sys.path entry module ``name`` was imported from (``file`` its __file__)."""
    depth = name.count(".") + (1 if file.stem == "__init__" else 0)
    return file.parents[depth]


@cache
def _source(name: str, file: str, target_root: Path | None) -> tuple[str, Path] | None:
    """``(path relative to its import root, path)`` of module ``name`` loaded from ``file``, where it
    counts: not the installation's (this package and the target's package always), and found at that
    relative path on sys.path (not a module a library loads by path from a cache of its own)."""
    path = Path(file).resolve()
    if not path.is_file():
        return None
    ours = path.is_relative_to(PACKAGE) or (target_root is not None and path.is_relative_to(target_root))
    if not ours and any(path.is_relative_to(p) for p in _installation()):
        return None
    relative = str(path.relative_to(_root_of(name, path)))
    found = _resolve(relative)
    return (relative, path) if found is not None and found.resolve() == path else None


def loaded_files(target: str) -> dict[str, str]:
    """``{path relative to its import root: hash}`` of the source of every module loaded in this
    process that counts (:func:`_source`), and of the data files in the directories of those that
    are in a package."""
    top = sys.modules.get(target.partition(":")[0].split(".")[0])
    top_file = getattr(top, "__file__", None)
    target_root = None if not top_file else Path(top_file).resolve()
    if target_root is not None and target_root.stem == "__init__":
        target_root = target_root.parent
    files, package_dirs = {}, {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name in ("__main__", "__mp_main__") or (source := _source(name, file, target_root)) is None:
            continue
        relative, path = source
        files[relative] = path
        if "." in name or path.stem == "__init__":
            package_dirs[path.parent] = Path(relative).parent
    for directory, relative in package_dirs.items():
        for data in directory.iterdir():
            if data.is_file() and data.suffix not in SOURCE_SUFFIXES and not data.name.startswith("."):
                files[str(relative / data.name)] = data
    return {rel: file_hash(path) for rel, path in sorted(files.items())}


def record(target: str, versions: dict) -> dict:
    """What decided a row measured in this process now (see the module's docstring)."""
    return {"target": target, "files": loaded_files(target), "settings": kernel_settings(), "versions": versions}


def digest(measured_by: dict) -> str:
    """12 hex digits of a :func:`record`: the row's ``fingerprint`` column."""
    return hashlib.sha256(json.dumps(measured_by, sort_keys=True).encode()).hexdigest()[:12]


def _resolve(relative: str) -> Path | None:
    """Where ``relative`` (a path under an import root) is found on sys.path now, first entry first."""
    for entry in sys.path:
        path = Path(entry or ".") / relative
        if path.is_file():
            return path
    return None


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def changes(measured_by: dict | None, target: str, versions: dict) -> tuple[str, str] | None:
    """Why a row recorded as ``measured_by`` is not what ``target`` with ``versions`` measures now:
    ``(kind, words)``, kind "other code" or "other settings"; None where nothing differs."""
    if not measured_by:
        return "other code", "the row records none of the files that measured it"
    if measured_by.get("target") != target:
        return "other code", f"{measured_by.get('target')} -> {target}"
    changed = [Path(rel).name + (" changed" if _resolve(rel) else " gone") for rel, old in
               measured_by.get("files", {}).items() if (path := _resolve(rel)) is None or file_hash(path) != old]
    if changed:
        return "other code", _some(changed)
    old_versions = measured_by.get("versions", {})
    moved = [f"{k} {old_versions.get(k)} -> {versions.get(k)}" for k in sorted(set(old_versions) | set(versions))
             if old_versions.get(k) != versions.get(k)]
    if moved:
        return "other code", _some(moved)
    old, now = measured_by.get("settings", {}), kernel_settings()
    settings = [f"{k} {'set' if k not in old else 'unset' if k not in now else 'changed'}"
                for k in sorted(set(old) | set(now)) if old.get(k) != now.get(k)]
    if settings:
        return "other settings", _some(settings)
    return None
