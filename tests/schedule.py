"""How `make test` spreads the suite over workers (pytest-xdist, `-n 2 --dist loadgroup`).

Many tests mostly wait (Slurm polling, a watchdog's timeout, a stopped rank), so two workers on two
cores finish sooner than one. Two rules keep that from costing more than it saves:

- A fixture that is expensive and shared (the Slurm cluster, the faults suite's reference run, the
  profiled run, the small bigMNIST set) would be built once per worker that needs it: every test that
  uses one is put in that fixture's group, and a group runs on one worker. The first fixture listed
  in SHARED that a test uses names its group.
- The system tier starts first, then integration, then unit: the long tests begin while the short
  ones are still there to fill the other worker at the end.

Without xdist (`pytest` alone, `make test-quick`) the groups are inert and only the order applies.
"""
from __future__ import annotations

import pytest

# fixture -> group; a test that uses several joins the first listed
SHARED = {
    "slurm": "slurm-cluster",
    "reference": "faults-reference-run",
    "profiled": "profiled-run",
    "small_set": "bigmnist-small-set",
}
ORDER = {"system": 0, "integration": 1, "unit": 2}


def group_of(item) -> str | None:
    names = getattr(item, "fixturenames", ())
    for fixture, group in SHARED.items():
        if fixture in names:
            return group
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist (trylast) reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    from tiers import tier_of

    for item in items:
        group = group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: ORDER.get(tier_of(item), 3))  # stable: the file order within a tier
