"""The two sides of an A/B run: a git revision checked out into its own worktree in a cache directory
(reused while it is clean and at that commit), or a checkout directory used as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..cli import UsageError

CACHE_ENV = "KDA_AB_CACHE"
CACHE_NAME = ".kda-ab"  # under the repository's top level, ignored by git through its own .gitignore


@dataclass(frozen=True)
class Side:
    """One side: what the user named, the tree its worker imports, its commit and whether the tree
    differs from it (None where unknown: a directory outside git)."""

    label: str  # "base" or "head"
    spec: str
    tree: Path
    sha: str | None
    dirty: bool | None


def git(*args: str, cwd: Path, check: bool = True) -> str | None:
    """``git ARGS`` in ``cwd``: its stdout stripped; None where it fails and ``check`` is off."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        if check:
            raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
        return None
    return done.stdout.strip()


def repository(cwd: Path) -> Path:
    """The top level of the git repository around ``cwd``; :class:`UsageError` outside one."""
    top = git("rev-parse", "--show-toplevel", cwd=cwd, check=False)
    if not top:
        raise UsageError(f"{cwd} is not in a git repository: give two revisions of one, or two checkout directories")
    return Path(top)


def is_checkout(path: Path) -> bool:
    return (path / "kda_impls" / "bench" / "case.py").is_file()


def commit_of(spec: str, repo: Path | None) -> str:
    """The full hash of revision ``spec`` in ``repo``; :class:`UsageError` where it names none."""
    sha = repo and git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}", cwd=repo, check=False)
    if not sha:
        where = f"a revision of {repo}" if repo else "a revision (no git repository here)"
        raise UsageError(f"{spec!r} is neither {where} nor a checkout directory (one holding kda_impls/bench/case.py)")
    return sha


def cache_dir(repo: Path) -> Path:
    """Where worktrees live: $KDA_AB_CACHE, else .kda-ab/ at the repository's top level."""
    return Path(os.environ.get(CACHE_ENV) or repo / CACHE_NAME)


def resolve(label: str, spec: str, cwd: Path) -> tuple[str, Path | None, str | None]:
    """(kind, directory, commit) of ``spec`` without touching anything: ("dir", path, None) for a
    checkout directory, ("rev", None, sha) for a revision; :class:`UsageError` for neither."""
    path = Path(spec)
    if path.is_dir() and is_checkout(path):
        return "dir", path.resolve(), None
    if path.is_dir():
        raise UsageError(f"{label} {spec!r} is a directory without kda_impls/bench/case.py: not a checkout of this "
                         f"project")
    top = git("rev-parse", "--show-toplevel", cwd=cwd, check=False)
    return "rev", None, commit_of(spec, Path(top) if top else None)


def worktree(repo: Path, sha: str) -> Path:
    """A clean checkout of ``sha`` under :func:`cache_dir`: reused where it is there, at ``sha`` and
    clean; else made (or reset) now."""
    cache = cache_dir(repo)
    cache.mkdir(parents=True, exist_ok=True)
    ignore = cache / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")  # the worktrees never show in the repository's status
    tree = cache / sha
    if tree.is_dir() and git("rev-parse", "HEAD", cwd=tree, check=False) == sha:
        if git("status", "--porcelain", "--untracked-files=no", cwd=tree, check=False) == "":
            return tree
        git("checkout", "--force", "--quiet", sha, cwd=tree)
        return tree
    if tree.exists():  # a worktree git no longer knows, or a stray directory: made again
        git("worktree", "remove", "--force", str(tree), cwd=repo, check=False)
        shutil.rmtree(tree, ignore_errors=True)
    git("worktree", "prune", cwd=repo)
    git("worktree", "add", "--detach", "--force", str(tree), sha, cwd=repo)
    return tree


def git_state(path: Path, env: Mapping[str, str]) -> dict:
    """The commit of checkout ``path`` and whether its tree differs from it, as
    :func:`kda_impls.bench.results.git_state` reads them (``KDA_GIT_SHA``/``KDA_GIT_DIRTY`` of ``env``,
    the side's environment, first)."""
    if env.get("KDA_GIT_SHA"):
        dirty = env.get("KDA_GIT_DIRTY")
        return {"sha": env["KDA_GIT_SHA"], "dirty": None if dirty is None else dirty == "1"}
    head = git("rev-parse", "HEAD", cwd=path, check=False)
    return {"sha": head, "dirty": None if head is None else git("status", "--porcelain", cwd=path, check=False) != ""}


def side(label: str, spec: str, cwd: Path, env: Mapping[str, str]) -> Side:
    """The side ``spec`` names, its worktree made or reused (call :func:`resolve` first to refuse bad
    input before anything is written); ``env`` is the side's environment (``--env-base``/``--env-head``
    over this process's)."""
    kind, path, sha = resolve(label, spec, cwd)
    if kind == "dir":  # its commit as the sweeps record it: the side's KDA_GIT_SHA where set, else its git HEAD
        state = git_state(path, env)
        return Side(label, spec, path, state["sha"], state["dirty"])
    return Side(label, spec, worktree(repository(cwd), sha), sha, False)
