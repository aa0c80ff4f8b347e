"""The class-data-sharing archive is made once, shared by concurrent callers, and never in
the way of a start (:mod:`outboxkit.embedded.class_archive`)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from threading import Thread

import pytest

from outboxkit.embedded.class_archive import archive_options, class_archive


class Trainer:
    """Stands in for a server's training run: writes what the JVM would at exit."""

    def __init__(self, *, fails: bool = False, writes: bool = True) -> None:
        self.runs = 0
        self.fails = fails
        self.writes = writes

    def __call__(self, options: list[str]) -> None:
        self.runs += 1
        [option] = options
        prefix = "-XX:ArchiveClassesAtExit="
        assert option.startswith(prefix)
        if self.writes:
            Path(option.removeprefix(prefix)).write_bytes(b"archive")
        if self.fails:
            raise OSError("the training server did not start")


@pytest.fixture
def jar(tmp_path: Path) -> Path:
    path = tmp_path / "server.jar"
    path.write_bytes(b"jar")
    return path


def _archive(directory: Path, jar: Path, train: Trainer, flags: list[str]) -> Path | None:
    return class_archive(
        directory, "server", java=sys.executable, classpath=[jar], flags=flags, train=train
    )


def test_made_once_then_reused(tmp_path: Path, jar: Path) -> None:
    train = Trainer()
    first = _archive(tmp_path / "cache", jar, train, ["-XX:+UseSerialGC"])
    assert first is not None
    assert first.read_bytes() == b"archive"
    assert _archive(tmp_path / "cache", jar, train, ["-XX:+UseSerialGC"]) == first
    assert train.runs == 1
    assert archive_options(first) == [f"-XX:SharedArchiveFile={first}"]
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_other_jars_or_flags_get_their_own(tmp_path: Path, jar: Path) -> None:
    train = Trainer()
    serial = _archive(tmp_path, jar, train, ["-XX:+UseSerialGC"])
    g1 = _archive(tmp_path, jar, train, ["-XX:+UseG1GC"])
    jar.write_bytes(b"another version of the jar")
    upgraded = _archive(tmp_path, jar, train, ["-XX:+UseSerialGC"])
    # The same jar in another place (another virtualenv's pyspark): the JVM checks the paths.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / jar.name
    moved.write_bytes(jar.read_bytes())
    other_place = _archive(tmp_path, moved, train, ["-XX:+UseSerialGC"])
    assert len({serial, g1, upgraded, other_place}) == 4
    assert train.runs == 4


def test_archives_no_jvm_can_map_are_removed(tmp_path: Path, jar: Path) -> None:
    """Each new virtualenv or version makes an archive of its own: those whose jars were
    replaced go when the next one is made; those still valid (other flags, other jars) stay."""
    train = Trainer()
    serial = _archive(tmp_path / "cache", jar, train, ["-XX:+UseSerialGC"])
    g1 = _archive(tmp_path / "cache", jar, train, ["-XX:+UseG1GC"])
    other_jar = tmp_path / "other.jar"
    other_jar.write_bytes(b"another server's jar")
    other = _archive(tmp_path / "cache", other_jar, train, ["-XX:+UseSerialGC"])
    assert all(a is not None and a.exists() for a in (serial, g1, other))

    jar.write_bytes(b"the jar installed again")
    again = _archive(tmp_path / "cache", jar, train, ["-XX:+UseSerialGC"])
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        name
        for archive in (other, again)
        for name in (archive.name, f"{archive.stem}.classpath", f"{archive.name}.lock")
        if archive is not None
    )


def test_concurrent_callers_wait_for_one_training_run(tmp_path: Path, jar: Path) -> None:
    train = Trainer()
    found: list[Path | None] = []
    threads = [
        Thread(target=lambda: found.append(_archive(tmp_path, jar, train, []))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert train.runs == 1
    assert len(set(found)) == 1
    assert found[0] is not None


@pytest.mark.parametrize(
    "train", [Trainer(fails=True), Trainer(writes=False)], ids=["fails", "writes nothing"]
)
def test_a_failed_training_run_leaves_no_archive(
    tmp_path: Path, jar: Path, train: Trainer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert _archive(tmp_path, jar, train, []) is None
    assert archive_options(None) == []
    assert not list(tmp_path.glob("*.jsa"))
    assert not list(tmp_path.glob("*.partial"))
    assert ("did not start" in caplog.text) == train.fails
