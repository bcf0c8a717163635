"""Fixtures of the data tests: the module's toy bundle and a private cache directory."""

from __future__ import annotations

import pytest

from fedray.data.table import DataBundle
from tests.data.bundles import toy_bundle


@pytest.fixture(scope="module")
def bundle() -> DataBundle:
    return toy_bundle()


@pytest.fixture(scope="module")
def _cache_dir(tmp_path_factory):
    """A private cache directory for the whole module (the user cache is never touched); modules opt in with
    ``pytestmark = pytest.mark.usefixtures("_cache_dir")``."""
    with pytest.MonkeyPatch.context() as mp:
        d = tmp_path_factory.mktemp("fedray_cache")
        mp.setenv("FEDRAY_CACHE_DIR", str(d))
        yield d
