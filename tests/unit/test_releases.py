"""Releases (RELEASING.md): each is a ``v<version>`` tag and, for a clone without tags, the
commit CHANGELOG.md records under its heading; the two agree, and the version a build reports
(``outboxkit --version``, each relay's presence) is a release's own or the next one's ``.dev``."""

from __future__ import annotations

import re

import pytest

from outboxkit._version import __version__
from outboxkit.migrations.compat import release
from tests import previous_release as releases_module
from tests.previous_release import (
    _git,
    _is_ancestor,
    previous_release,
    recorded_releases,
    tagged_releases,
)


def test_each_release_is_recorded_where_its_tag_is() -> None:
    """Would catch a CHANGELOG.md heading without its commit once a later version is built, a
    recorded commit that is not in the history, or a tag and a record that disagree (a clone
    with tags and one without would test against different releases)."""
    head = _git("rev-parse", "HEAD")
    tags = tagged_releases()
    for version, commit in recorded_releases().items():
        if commit is None:
            assert version == __version__, f"{version}: released, and no commit recorded"
            continue
        assert _is_ancestor(commit, head), f"{version}: {commit} is not in this history"
        if version in tags:
            assert tags[version] == commit, f"tag v{version} is {tags[version]}, not {commit}"
    for version in tags:
        assert version in recorded_releases(), f"v{version} has no heading in CHANGELOG.md"


def test_the_version_is_a_release_or_the_next_ones_development() -> None:
    """``__version__`` is the release being made (its heading in CHANGELOG.md, no commit yet)
    or, after it, the next release's ``.devN`` with an Unreleased section: never a released
    version again, which every build after the tag reported until this test."""
    recorded = recorded_releases()
    released = [version for version, commit in recorded.items() if commit is not None]
    if re.fullmatch(r"\d+\.\d+\.\d+", __version__):
        assert __version__ in recorded, f"no CHANGELOG.md heading for {__version__}"
        assert recorded[__version__] is None, f"{__version__} is released already: .dev it"
    else:
        assert re.fullmatch(r"\d+\.\d+\.\d+\.dev\d+", __version__), __version__
        assert "\n## Unreleased" in releases_module.CHANGELOG.read_text()
    assert all(release(__version__) > release(version) for version in released)


def test_release_n_1_is_the_same_with_tags_and_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI may clone without tags: the side-by-side upgrade test must then build the same N-1
    from the commit CHANGELOG.md records."""
    with_tags, _ = previous_release()
    monkeypatch.setattr(releases_module, "tagged_releases", dict)
    without_tags, label = previous_release()
    assert without_tags == with_tags, label


def test_a_release_heading_is_read_with_its_commit() -> None:
    text = (
        "# Changelog\n\n## Unreleased\n\n- a change\n\n"
        f"## 0.2.0 (commit {'a' * 40})\n\n## 0.1.0 (commit {'b' * 40})\n\n- first\n"
    )
    assert recorded_releases(text) == {"0.2.0": "a" * 40, "0.1.0": "b" * 40}
    assert recorded_releases("## 0.3.0\n") == {"0.3.0": None}
