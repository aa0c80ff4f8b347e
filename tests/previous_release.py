"""Release N-1, built into a wheel and installed into a virtualenv of its own, for the
side-by-side upgrade test (tests/integration/test_upgrade_side_by_side.py, docs/upgrading.md).

N-1 is the newest release before the commit under test (:func:`previous_release`): a release is
a ``v<version>`` tag, or the commit CHANGELOG.md records under the release's heading (``## 0.1.0
(commit <40 hex digits>)``), which is what a clone without tags knows of it (CI systems often
clone without them); where both exist they must agree (tests/unit/test_releases.py). Before
any release, N-1 was the parent of the newest commit that added a migration file. Its tree
comes out of git (``git archive``: symlinks kept), its wheel is built
by ``python -m build`` (isolated, as RELEASING.md builds it: setuptools from the index), and it
is installed with ``--no-deps`` into ``~/.cache/outboxkit/release-<commit>``, whose ``.pth``
adds this environment's site-packages after its own: N-1's code, this environment's
dependencies (the same versions for a release of recent months; an old one would need its own,
installed from the index). Built once per commit, under a lock file.

``run_dir`` holds only N-1's ``tests`` package, for ``PYTHONPATH``: the inbox test app and the
writers of N-1. Processes of N-1 must start outside the repository, or ``python -m`` would put
the current tree's ``outboxkit`` first on their path.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from outboxkit.migrations.compat import release

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "outboxkit"
CHANGELOG = REPO / "CHANGELOG.md"
#: A release's heading in CHANGELOG.md, with the commit recorded once it is tagged.
_HEADING = re.compile(r"^## (\d+(?:\.\d+)+)\b(?:[^\n]*?\bcommit ([0-9a-f]{40}))?[^\n]*$", re.M)


@dataclass(frozen=True)
class Release:
    commit: str
    #: ``v0.1.0``, or ``<commit> (before <migration commit>)`` until a tag exists.
    label: str
    python: Path
    #: A directory with only N-1's ``tests`` package: what its processes get as PYTHONPATH.
    run_dir: Path

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.run_dir), "PYTHONDONTWRITEBYTECODE": "1"}


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def _whole_history() -> None:
    """N-1 is found in the history: a shallow clone (CI systems often make one) fetches the rest
    from where it was cloned, or says why it cannot."""
    if _git("rev-parse", "--is-shallow-repository") != "true":
        return
    try:
        _git("fetch", "--quiet", "--unshallow", "--tags")
    except subprocess.CalledProcessError as exc:
        raise AssertionError(
            "release N-1 is found in git history, and this clone is shallow and could not fetch "
            f"the rest (git fetch --unshallow: {exc.stderr.strip()}): clone with full history"
        ) from None


def recorded_releases(text: str | None = None) -> dict[str, str | None]:
    """Each release CHANGELOG.md (or ``text``) has a heading for → the commit recorded under it
    (``None`` for the release being made, recorded once tagged)."""
    found = _HEADING.findall(CHANGELOG.read_text() if text is None else text)
    return {version: commit or None for version, commit in found}


def tagged_releases() -> dict[str, str]:
    """Each ``v<version>`` tag of this clone → its commit."""
    tags = _git("tag", "--list", "v*").split()
    return {tag.removeprefix("v"): _git("rev-list", "-n", "1", tag) for tag in tags}


def releases() -> dict[str, tuple[str, str]]:
    """Each release this clone knows → (its commit, its label): its tag, else the commit
    CHANGELOG.md records (a clone without tags)."""
    known = {
        version: (commit, f"{commit[:9]} (CHANGELOG.md's {version}; no tag v{version} here)")
        for version, commit in recorded_releases().items()
        if commit is not None
    }
    known |= {version: (commit, f"v{version}") for version, commit in tagged_releases().items()}
    return known


def previous_release() -> tuple[str, str]:
    """(commit, label) of release N-1: the newest release whose commit is an ancestor of the
    commit under test and not that commit itself (on a release's own commit, the release
    before it)."""
    _whole_history()
    head = _git("rev-parse", "HEAD")
    earlier = [
        (version, commit, label)
        for version, (commit, label) in releases().items()
        if commit != head and _is_ancestor(commit, head)
    ]
    if earlier:
        _, commit, label = max(earlier, key=lambda found: release(found[0]))
        return commit, label
    newest = _git(
        "log", "-1", "--diff-filter=A", "--format=%H", "HEAD", "--", "outboxkit/migrations/files"
    )
    assert newest, "no commit added a migration: cannot tell release N-1"
    commit = _git("rev-parse", f"{newest}^")
    return commit, f"{commit[:9]} (before {newest[:9]}, the newest migration)"


def _is_ancestor(commit: str, head: str) -> bool:
    """``commit`` is in ``head``'s history (a commit this clone does not have is not)."""
    result = subprocess.run(
        ["git", "merge-base", "--is-ancestor", commit, head],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def build_release() -> Release:
    commit, label = previous_release()
    home = CACHE / f"release-{commit}"
    venv_dir, run_dir, done = home / "venv", home / "run", home / "installed"
    python = venv_dir / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"release-{commit}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            _install(commit, home, venv_dir, run_dir)
            done.write_text(label)
    return Release(commit, label, python, run_dir)


def _install(commit: str, home: Path, venv_dir: Path, run_dir: Path) -> None:
    src = home / "src"
    src.mkdir()
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "archive", commit], cwd=REPO, stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(src, filter="tar")
    dist = home / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), "."],
        cwd=src,
        capture_output=True,
        check=True,
    )
    (wheel,) = dist.glob("outboxkit-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)], check=True)
    python = venv_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        check=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # After the venv's own site-packages: outboxkit from the wheel, the rest from here.
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "_outboxkit_dependencies.pth").write_text(ours + "\n")
    run_dir.mkdir()
    (run_dir / "tests").symlink_to(src / "tests")
    shutil.rmtree(src / "outboxkit")  # nothing of N-1's tree may shadow its wheel
