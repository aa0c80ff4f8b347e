"""A JVM's class-data-sharing (CDS) archive, made once per JDK, classpath and flags.

A JVM that maps an archive of the classes it loads at start skips reading, parsing and
verifying them again: a test Kafka broker is ready in ~1.5 s on ~2.2 core-s instead of ~2.8 s
on ~3.5 (C1 and the serial GC, this machine), and the test suite starts brokers by the dozen.
Java 17 has no ``-XX:+AutoCreateSharedArchive`` (Java 19), so the archive is made here: one
run of the server with ``-XX:ArchiveClassesAtExit`` that ends cleanly, its archive renamed into
place. The JVM checks an archive against its own build and classpath and ignores one that does
not match, so a stale archive costs the saving, never a start; a failed training run leaves
none and servers start as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["archive_options", "class_archive"]

log = logging.getLogger(__name__)


def class_archive(
    directory: Path,
    name: str,
    *,
    java: str,
    classpath: Sequence[Path],
    flags: Sequence[str],
    train: Callable[[list[str]], None],
) -> Path | None:
    """The archive for ``java`` with ``classpath`` and ``flags`` in ``directory``, made by
    ``train`` on first use; None if it cannot be made.

    ``train(options)`` runs the server once with ``options`` added to its JVM's and ends it
    cleanly (the JVM writes the archive as it exits). Concurrent callers (parallel test
    workers) wait for one training run under a file lock."""
    stamps = [_stamp(jar) for jar in classpath]
    path = directory / f"{name}-{_fingerprint(java, stamps, flags)}.jsa"
    if path.exists():
        return path
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _locked(directory / f"{path.name}.lock"):
            if not path.exists():
                partial = path.with_suffix(f".{os.getpid()}.partial")
                try:
                    train([f"-XX:ArchiveClassesAtExit={partial}"])
                    if partial.exists():
                        path.with_suffix(".classpath").write_text(
                            "".join(f"{stamp}\n" for stamp in stamps)
                        )
                        partial.replace(path)
                        _remove_unusable(directory, name)
                finally:
                    partial.unlink(missing_ok=True)
    except Exception as error:  # a start without the archive is only slower
        log.warning("no class-data-sharing archive for %s: %s", name, error)
    return path if path.exists() else None


def archive_options(archive: Path | None) -> list[str]:
    """The JVM options that map ``archive`` (none without one)."""
    return [f"-XX:SharedArchiveFile={archive}"] if archive else []


def _stamp(jar: Path) -> str:
    """What the JVM checks of a jar on an archive's classpath: its path, size and time."""
    stat = jar.stat()
    return f"{jar.resolve()}\t{stat.st_size}\t{stat.st_mtime_ns}"


def _fingerprint(java: str, stamps: Sequence[str], flags: Sequence[str]) -> str:
    """Changes with the JDK's build (its ``libjvm.so``), the jars (where they are: two
    virtualenvs' pyspark are two classpaths) and the flags that shape an archive."""
    digest = hashlib.sha256()
    binary = Path(shutil.which(java) or java).resolve()
    for library in binary.parent.parent.glob("lib/server/libjvm.so"):
        stat = library.stat()
        digest.update(f"{library}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(str(binary).encode())
    digest.update("\0".join([*stamps, *flags]).encode())
    return digest.hexdigest()[:16]


def _remove_unusable(directory: Path, name: str) -> None:
    """Delete the archives no JVM can map any more: a jar of their classpath was removed or
    replaced (a virtualenv made again, a new version). A JVM that maps one keeps its mapping."""
    for archive in directory.glob(f"{name}-*.jsa"):
        listing = archive.with_suffix(".classpath")
        try:
            usable = all(
                _stamp(Path(line.split("\t")[0])) == line
                for line in listing.read_text().splitlines()
            )
        except OSError:  # no listing (an older archive), or a jar gone
            usable = False
        if not usable:
            for stale in (archive, listing, archive.with_name(f"{archive.name}.lock")):
                stale.unlink(missing_ok=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
