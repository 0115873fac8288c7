"""How `make test` spreads the suite over workers (pytest-xdist, `-n 2 --dist loadgroup`).

Some tests mostly wait (Slurm polling, a watchdog's timeout, a stopped rank), so two workers on two
cores finish sooner than one. Most of the suite keeps both cores busy, so the gain is what the waits
leave free: tests/DURATIONS.md sets the wall time beside the tests' summed time. Three rules keep
the workers from costing more than they save:

- A fixture that is expensive and shared (the Slurm cluster, the faults suite's reference run, the
  profiled run, the small bigMNIST set) would be built once per worker that needs it: every test that
  uses one is put in that fixture's group, and a group runs on one worker. The first fixture listed
  in SHARED that a test uses names its group. xdist 3.8 marks a test's group by appending
  "@group" to item._nodeid, which pytest 9 ignores (node ids live in item._id): without the suffix
  set here, --dist loadgroup spread the groups like --dist load, and every worker started its own
  Slurm cluster (two munged daemons racing at the start).
- The system tier starts first, then integration, then unit: the long tests begin while the short
  ones are still there to fill the other worker at the end.
- Each worker's processes get its share of the cores: OMP_NUM_THREADS = cores // workers, unless
  it is set already. A one-rank run with two OpenMP threads beside another worker's work ran 3.7x
  slower than alone (217 s against 58 s: threads waiting at barriers for a core the other worker
  holds), where its fair share would be 2x. The launcher keeps a value it finds in the environment,
  and test_gpu_path checks the default without it.

Without xdist (`pytest` alone, `make test-quick`) the groups are inert and only the order applies.
"""

from __future__ import annotations

import os

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


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.hookimpl(tryfirst=True)  # before xdist (trylast) reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    from tiers import tier_of

    suffix = getattr(config.option, "loadgroup", False) and hasattr(items[0] if items else None, "_id")
    for item in items:
        group = group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
            if suffix:  # xdist 3.8 writes the group into item._nodeid, which pytest 9 no longer reads: do it here
                from _pytest.nodeid import coerce_node_id

                item._id = coerce_node_id(f"{item.nodeid}@{group}")
    items.sort(key=lambda item: ORDER.get(tier_of(item), 3))  # stable: the file order within a tier
