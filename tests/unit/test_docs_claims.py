"""What the documents say holds for the code: defaults a page states, what a page says was (not)
done, and code blocks a reader copies into a test file (issue #28)."""

from __future__ import annotations

import builtins
import json
import re
import ssl
import symtable

import pytest
from pydantic_settings import BaseSettings

from outboxkit.core.settings import ENV_PREFIX, KafkaConnectionSettings
from outboxkit.embedded.kafka_jars import _ARTIFACTS
from outboxkit.inbox import InboxSettings
from outboxkit.preflight.kafka_acls import Acl
from outboxkit.preflight.kafka_handshake import _describe
from outboxkit.relay import RelaySettings
from tests.docs_snippets import REPO, blocks

#: The component each page documents, and its settings.
COMPONENT_PAGES: dict[str, type[BaseSettings]] = {
    "docs/relay.md": RelaySettings,
    "docs/inbox.md": InboxSettings,
}


def _differing_defaults() -> list[str]:
    """Settings the relay and the inbox both read, from one variable, with different defaults."""
    relay, inbox = RelaySettings.model_fields, InboxSettings.model_fields
    return [n for n in relay if n in inbox and relay[n].default != inbox[n].default]


def _named(page: str, name: str) -> bool:
    return f"`{ENV_PREFIX}{name.upper()}`" in (REPO / page).read_text()


#: (page, setting): a page that names such a variable must say its component's default, as one
#: variable means two things. docs/configuration.md (generated) lists it once, in the relay's
#: section.
SHARED_ON_PAGES = [(p, n) for n in _differing_defaults() for p in COMPONENT_PAGES if _named(p, n)]


def _stated_defaults(text: str, variable: str) -> list[float]:
    """The first ``default N`` of every sentence (or table cell) that names ``variable``."""
    pattern = rf"`{variable}`[^.|]*?\bdefault (\d+(?:\.\d+)?)"
    return [float(n) for n in re.findall(pattern, text)]


def test_a_shared_variable_with_two_defaults_is_found() -> None:
    assert ("docs/relay.md", "stall_after") in SHARED_ON_PAGES
    assert ("docs/inbox.md", "stall_after") in SHARED_ON_PAGES
    text = "until `X` seconds (default 60; the relay's default is 120). `X` again, default 5."
    assert _stated_defaults(text, "X") == [60.0, 5.0]


@pytest.mark.parametrize(("page", "name"), SHARED_ON_PAGES)
def test_each_component_page_states_its_own_default(page: str, name: str) -> None:
    settings = COMPONENT_PAGES[page]
    variable = f"{ENV_PREFIX}{name.upper()}"
    stated = _stated_defaults((REPO / page).read_text(), variable)
    default = settings.model_fields[name].default
    assert stated, f"{page} must say {variable}'s default for {settings.__name__}: {default:g}"
    assert set(stated) == {default}, f"{page} says {variable} defaults to {stated}: {default:g}"


def test_the_covered_head_read_is_not_called_untried() -> None:
    """docs/mongodb.md's index table lists the head read from outbox_head_idx alone (migration
    0002); no sentence about choosing the head from the index alone may say it was not tried."""
    migration = json.loads(
        (REPO / "outboxkit/migrations/files/mongodb/0002_head_index.json").read_text()
    )
    [index] = migration[0]["command"]["indexes"]
    assert index["name"] == "outbox_head_idx"
    assert "key" in index["key"]  # the key in the index: the choice of each key's head is covered
    text = " ".join((REPO / "docs/mongodb.md").read_text().split())
    sentences = [s for s in re.split(r"(?<=\.)\s+", text) if "from the index alone" in s]
    assert sentences
    untried = [s for s in sentences if re.search(r"\b(never|not|neither|nor)\b[^.]*\btried\b", s)]
    assert untried == []


def _undefined_names(code: str) -> set[str]:
    """Names a module reads that nothing in it binds and that are not builtins."""
    module = symtable.symtable(code, "<snippet>", "exec")
    bound = {s.get_name() for s in module.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [module]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is module or symbol.is_global()):
                read.add(symbol.get_name())
    return read - bound - set(dir(builtins))


def test_undefined_names_are_found() -> None:
    code = "import a\n\ndef f(x):\n    return a.b(x, Path('p'), len(x), [y for y in x])\n"
    assert _undefined_names(code) == {"Path"}


def _python_blocks(page: str) -> list[str]:
    """The blocks of ``page`` that are Python, with or without a language tag."""
    found = []
    for block in blocks(REPO / page):
        if block.language not in ("", "python"):
            continue
        try:
            compile(block.code, page, "exec")
        except SyntaxError:
            continue  # output, not code
        found.append(block.code)
    return found


@pytest.mark.parametrize("index", range(len(_python_blocks("docs/testing.md"))))
def test_the_testing_guide_blocks_define_every_name_they_use(index: int) -> None:
    """Each block of docs/testing.md is a test module a reader copies: it imports or defines
    what it uses (its own service's modules are ``myservice``)."""
    code = _python_blocks("docs/testing.md")[index]
    assert _undefined_names(code) == set(), code


def test_the_security_page_says_what_the_printed_acl_commands_need() -> None:
    """#44 item 16: the page printed `kafka-acls.sh … --command-config admin.properties` without
    saying what that file holds or where the script comes from, nor the ACLs of `topics sync` and
    `topics create`, nor the message of a broker that sends its authority in the chain."""
    page = (REPO / "docs/security.md").read_text()
    text = " ".join(page.split())
    command = Acl("TOPIC", "orders", ("READ",), "consume").kafka_acls_command("User:billing")
    assert "--command-config admin.properties" in command
    [properties] = [b.code for b in blocks(REPO / "docs/security.md") if b.info.startswith("prop")]
    assert "with `--command-config admin.properties`: the client settings" in text
    for key in ("security.protocol=", "sasl.mechanism=", "sasl.jaas.config=", "ssl.truststore"):
        assert key in properties
    # The script: not fetched by `dev jars` (the broker's runtime jars only).
    assert not any("tools" in artifact or "bin" in artifact for _, artifact, _ in _ARTIFACTS)
    assert "nor among the jars `outboxkit dev jars` fetches" in text
    assert "Apache Kafka distribution" in text
    assert "`topics create` needs CREATE" in text
    assert "and DESCRIBE on the topics, which it reads back" in text
    assert "`topics sync` needs DESCRIBE on the topics" in text
    # The untrusted-authority line as the client says it when the chain ends in an unknown root.
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = "self-signed certificate in certificate chain"
    shown = _describe(KafkaConnectionSettings(kafka_security_protocol="SSL"), "broker:9093", error)
    assert shown.what is not None
    assert shown.what.replace("broker:9093", "…") in page
