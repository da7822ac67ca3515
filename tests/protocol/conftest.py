"""The test build of the shim's client the protocol's tests run in processes of their own."""

from __future__ import annotations

import pytest
from conformance_build import ConformanceBuild, build
from run_builds import BuildOnce


@pytest.fixture(scope="session")
def conformance_build(build_once: BuildOnce) -> ConformanceBuild:
    return build(build_once)
