"""Every document the code, comments, --help or README cite is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("loadgen", "server", "kernels", "traces", "golden_al", "benchmarks", "tests", "docs")
CITED_DOC = re.compile(r"\b(?:docs|benchmarks)/[\w./-]+\.md\b")
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
    assert {"docs/architecture.md", "docs/sparse_mla.md", "docs/results_schema.md"} <= cited
    missing = sorted(doc for doc in cited if not (REPO / doc).is_file())
    assert not missing, f"cited but not in the repository: {missing}"
