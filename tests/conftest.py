"""Suite-wide collection order: modules marked `slow` run first.

The suite is spread over worker processes (README: `-n 3 --dist loadscope
--no-loadscope-reorder`: each module on one worker, handed out in collection order as workers
free up). A module of a minute or more that starts last keeps one worker busy after the others
have finished; started first, the short modules fill in around it.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order otherwise
