"""The simulation's in-memory bucket passes the cloud contract every backend passes."""

from __future__ import annotations

import pytest

from ledgerd.sync.cloud import CloudStore
from tests.sim.bucket import MemoryStore
from tests.sync.test_cloud_contract import (
    test_a_range_past_the_end_is_an_error,
    test_delete,
    test_list_is_ordered_and_filtered,
    test_missing_object,
    test_names_are_validated,
    test_objects_are_written_once,
    test_put_get_round_trip,
    test_ranged_get,
)

__all__ = [
    "test_a_range_past_the_end_is_an_error",
    "test_delete",
    "test_list_is_ordered_and_filtered",
    "test_missing_object",
    "test_names_are_validated",
    "test_objects_are_written_once",
    "test_put_get_round_trip",
    "test_ranged_get",
]


@pytest.fixture
def store() -> CloudStore:
    return MemoryStore()
