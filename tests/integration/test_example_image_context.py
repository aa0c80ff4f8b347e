"""compose/Dockerfile.example builds: the files its COPY lines put in the image are enough to
build the outboxkit wheel its `pip install` needs (CI has no Docker daemon, so the context is
assembled by hand, exactly as the Dockerfile's COPY lines lay it out)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "compose" / "Dockerfile.example"
WORKDIR = PurePosixPath("/app")

pytestmark = pytest.mark.slow


def copy_lines(dockerfile: str) -> list[tuple[list[str], str]]:
    """The (sources, destination) of every COPY line, flags such as --chown dropped."""
    copies = []
    for line in dockerfile.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        assert len(args) >= 2, line
        copies.append((args[:-1], args[-1]))
    return copies


def test_copy_lines_are_read_with_their_sources_and_destination() -> None:
    assert copy_lines("FROM x\n# COPY no\nCOPY --chown=1 a b ./\ncopy c ./c\n") == [
        (["a", "b"], "./"),
        (["c"], "./c"),
    ]


def lay_out_image(root: Path) -> None:
    """Copies what the Dockerfile's COPY lines copy, where they put it (relative to WORKDIR)."""
    for ignore in (REPO / ".dockerignore", DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")):
        assert not ignore.exists(), f"{ignore.name} exists: apply it here too"
    for sources, destination in copy_lines(DOCKERFILE.read_text()):
        target = root / (WORKDIR / destination).relative_to(WORKDIR)
        for source in sources:
            path = REPO / source
            if path.is_dir():
                # COPY of a folder copies its contents; symlinks stay symlinks, as in Docker.
                shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
            else:
                into = target / path.name if destination.endswith("/") else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into)


@pytest.mark.timeout(300)
def test_the_example_image_context_builds_the_wheel(tmp_path: Path) -> None:
    context, dist = tmp_path / "app", tmp_path / "dist"
    lay_out_image(context)
    # What the Dockerfile's `pip install .` does first: build the wheel (pip's build isolation
    # fetches setuptools>=77, as it does in the image).
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(context)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("outboxkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    with (REPO / "pyproject.toml").open("rb") as f:
        packages: list[str] = tomllib.load(f)["tool"]["setuptools"]["packages"]
    missing = [p for p in packages if f"{p.replace('.', '/')}/__init__.py" not in names]
    assert missing == [], f"the image's wheel lacks {missing}"
