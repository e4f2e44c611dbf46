"""The docs cover what the registry holds, and every link in them resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlzoo.kinds import KINDS
from zoo import REGISTRY, builtin_names

ROOT = Path(__file__).parents[1]
PAGES = {kind.name: kind.docs for kind in KINDS.values()}
DOCUMENTED = [(kind, name) for kind in PAGES for name in builtin_names(kind)]


@pytest.mark.parametrize("kind, name", DOCUMENTED, ids=[f"{k}:{n}" for k, n in DOCUMENTED])
def test_every_registered_component_is_on_its_family_page(kind: str, name: str) -> None:
    text = (ROOT / PAGES[kind]).read_text()
    component = REGISTRY.get(kind, name)
    assert f"`{name}`" in text, f"{name} is not on {PAGES[kind]}"
    if component.paper and component.paper.startswith("arXiv:"):
        assert component.paper.removeprefix("arXiv:") in text, (name, component.paper)
    for field in (component.params.__dataclass_fields__ if component.params else ()):
        assert f"`{field}`" in text, (name, field)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "plugins/rlzoo-example/README.md"]


def _anchors(path: Path) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        assert resolved.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.relative_to(ROOT)}: no heading for #{anchor} in {file}"
