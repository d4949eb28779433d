"""docs/configuration.md names every variable the code and the deployment files use."""

from __future__ import annotations

import re

from tests.deploy._files import DEPLOY, ROOT

VAR = re.compile(r"\bTOKENWIRE_[A-Z0-9_]*[A-Z0-9]\b")
# Stream names and prefixes that look like variables.
NOT_VARIABLES = {"TOKENWIRE_EVENTS", "TOKENWIRE_DLQ", "TOKENWIRE_ASSEMBLER", "TOKENWIRE_GATEWAY"}


def _documented() -> str:
    return (ROOT / "docs" / "configuration.md").read_text()


def _used_in(paths: list[str]) -> set[str]:
    found: set[str] = set()
    for pattern in paths:
        for path in ROOT.glob(pattern):
            found |= set(VAR.findall(path.read_text()))
    return found - NOT_VARIABLES


def test_every_variable_the_code_reads_is_documented() -> None:
    used = _used_in(["src/tokenwire/**/*.py"])
    assert used
    assert {v for v in used if v not in _documented()} == set()


def test_every_variable_the_deployment_sets_is_documented() -> None:
    used = _used_in(["docker-compose.yml", "deploy/**/*.yaml", "Dockerfile"])
    assert {v for v in used if v not in _documented()} == set()
    nats = set(re.findall(r"\$(NATS_\w+)", (DEPLOY / "nats" / "accounts.conf").read_text()))
    assert {v for v in nats if v not in _documented()} == set()


def test_every_service_page_exists_and_names_its_command() -> None:
    for folder, command in [
        ("gateway", "tokenwire gateway"),
        ("telemetry", "tokenwire telemetry"),
        ("assembler", "tokenwire assembler"),
        ("scripted-provider", "tokenwire scripted-provider"),
    ]:
        text = (ROOT / "docs" / "services" / f"{folder}.md").read_text()
        assert command in text, folder


def test_metric_names_in_the_docs_are_exposed() -> None:
    from tests.deploy._files import exposed_metric_names, metric_names_in

    exposed = exposed_metric_names()
    for path in [
        ROOT / "docs" / "services" / "gateway.md",
        ROOT / "docs" / "services" / "telemetry.md",
        ROOT / "docs" / "services" / "assembler.md",
        ROOT / "docs" / "operations.md",
    ]:
        for name in metric_names_in(path.read_text()):
            assert name in exposed or f"{name}_bucket" in exposed, f"{path.name}: {name}"


def _slugs(markdown: str) -> set[str]:
    """The anchors GitHub makes of a page's headings (lower case, punctuation dropped, spaces
    as dashes)."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_in_the_readme_and_docs_resolve() -> None:
    """Every relative link of README.md and docs/ names a file that exists and, with an
    anchor into a Markdown page, one of its headings (pages move when docs are split)."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _slugs(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
