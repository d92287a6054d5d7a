"""models.memory: budgets parsed from every accepted form, refused forms named, rows that fit."""

import pytest

from models.memory import MemoryRefused, available_bytes, budget_bytes, format_bytes, progress_enabled, rows_that_fit


def test_budget_forms():
    assert budget_bytes("512MiB") == 512 * 2**20
    assert budget_bytes("8GB") == 8 * 10**9
    assert budget_bytes("1.5 gib") == int(1.5 * 2**30)
    assert budget_bytes(1e9) == 10**9
    assert 0 < budget_bytes(None) <= available_bytes()


@pytest.mark.parametrize("bad", ["8XB", "abc", -1, 0, True, float("inf"), [1]])
def test_bad_budget_names_argument(bad):
    with pytest.raises(ValueError, match="max_mem"):
        budget_bytes(bad, argument="max_mem")


def test_rows_that_fit_and_refusal():
    assert rows_that_fit(1e6, 10**8, 512, "x") == 100
    assert rows_that_fit(1e6, 10**8, 7, "x") == 7
    with pytest.raises(MemoryRefused, match=r"grid .*1\.05 GB.*100 MB"):
        rows_that_fit(1e9, 10**8, 512, "grid", fixed=5e7)
    assert format_bytes(403e6) == "403 MB" and format_bytes(12) == "12 B"


def test_progress_off_in_tests():
    assert not progress_enabled(True)
