"""The built images, started: containers of the node and notebook images made with buildah.

These tests check what `make images` has just built, and run as its last step
(KIWI_TEST_IMAGES=1). Anywhere else they skip: without buildah, or an image built from other
sources than the ones under test, they could say nothing true.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(item.path).parents]
    if not ours:
        return
    if os.environ.get("KIWI_TEST_IMAGES") != "1":
        reason = "the images' smoke tests run in `make images`, right after it builds them"
    elif shutil.which("buildah") is None:
        reason = "needs buildah (apt-get install buildah)"
    else:
        return
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=reason))
