"""The test build of the shim's client the protocol's tests run in processes of their own."""

from __future__ import annotations

import pytest
from conformance_build import ConformanceBuild, build


@pytest.fixture(scope="session")
def conformance_build(tmp_path_factory: pytest.TempPathFactory) -> ConformanceBuild:
    return build(tmp_path_factory)
