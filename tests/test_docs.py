"""Every document the code, comments, --help or README cite is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("loadgen", "server", "kernels", "traces", "golden_al", "benchmarks", "tests", "docs")
CITED_DOC = re.compile(r"\b(?:docs|benchmarks)/[\w./-]+\.md\b")
# A module of the five packages named by its path: `loadgen/run/replay.py`, not `tests/loadgen/...`.
MODULE_PATH = re.compile(r"(?<![\w/.-])(?:loadgen|server|kernels|traces|golden_al)/[\w./-]+\.(?:py|c)\b")
# Design notes that live outside the repository: code must not send a reader there.
OUTSIDE = re.compile(r"\b(?:SPARSE_MLA|DESIGN)\.md\b")


def _texts() -> list[tuple[Path, str]]:
    files = [REPO / "README.md"]
    for folder in SOURCES:
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".md") and p.is_file()]
    return [(p, p.read_text(errors="replace")) for p in files]


def test_cited_docs_exist_and_nothing_cites_outside_notes():
    cited = set()
    for path, text in _texts():
        assert not OUTSIDE.search(text), f"{path.relative_to(REPO)} cites a note outside the repository"
        cited.update(CITED_DOC.findall(text))
    reference = {f"docs/{name}.md" for name in ("architecture", "sparse_mla", "results_schema", "loadgen", "metrics",
                                                "recipes", "server", "inferencex", "kernels", "development")}
    assert reference <= cited
    missing = sorted(doc for doc in cited if not (REPO / doc).is_file())
    assert not missing, f"cited but not in the repository: {missing}"


def test_readme_is_a_front_door():
    """The README introduces and links; the reference lives in docs/."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in readme, f"README does not link docs/{doc.name}"


def test_module_paths_in_the_docs_exist():
    """A module README.md or docs/ names by its path is there (a layout change moves modules)."""
    missing = sorted({f"{doc.relative_to(REPO)}: {path}" for doc in [REPO / "README.md", *(REPO / "docs").glob("*.md")]
                      for path in MODULE_PATH.findall(doc.read_text()) if not (REPO / path).is_file()})
    assert not missing, f"modules named but not in the repository: {missing}"
