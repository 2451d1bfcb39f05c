"""The flag tables in docs/ are the argparse definitions: docs/cli_tables.py writes them, and these
tests fail when a flag, its help or a command changes without `python docs/cli_tables.py`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli_tables():
    spec = importlib.util.spec_from_file_location("cli_tables", REPO / "docs" / "cli_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_match_argparse_and_document_every_command():
    problems = _cli_tables().problems()
    assert not problems, "\n".join(problems + ["run: python docs/cli_tables.py"])


def test_a_stale_block_is_rewritten_from_argparse():
    cli_tables = _cli_tables()
    stale = "<!-- cli:loadgen replay -->\n| `--url URL` | old text |\n<!-- /cli -->\n"
    fresh = cli_tables.rewrite(stale)
    assert fresh != stale and "old text" not in fresh
    assert "| `--conc N[,N...]` |" in fresh and "| `--warmup Ns\\|Nreq` |" in fresh
    assert cli_tables.rewrite(fresh) == fresh


def test_every_runnable_command_is_found():
    commands = set(_cli_tables().leaf_commands())
    assert {"loadgen replay", "loadgen bench", "loadgen recipe run", "loadgen golden-al show",
            "server start"} <= commands
    assert "loadgen recipe" not in commands  # only its subcommands run something
