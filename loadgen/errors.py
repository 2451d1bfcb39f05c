"""Errors the library raises for bad input; the CLI (loadgen/cli/) maps them to exit codes.

Library modules raise `UsageError` themselves instead of importing the CLI, so the import graph
points one way: the CLI -> its commands -> library.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a field): printed to stderr without a traceback, exit 2."""
