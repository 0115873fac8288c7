"""The record schema is documented from its one definition and written atomically."""

from __future__ import annotations

import pytest

from kernels.records import schema as records
from kernels.workloads import Metric
from conftest import ROOT

pytestmark = pytest.mark.unit


def test_results_readme_is_generated_from_the_schema():
    from kernels.workloads import record_fields

    assert (ROOT / "results" / "README.md").read_text() == records.schema_markdown(record_fields()), (
        "results/README.md is stale: run `make records-doc`"
    )


def test_atomic_writes_leave_no_temp_files_and_roundtrip(tmp_path):
    records.write_json(tmp_path / "summary.json", {"status": "complete", "x": 1.5})
    cols = records.metric_columns((Metric("acc"),))
    records.write_metrics(tmp_path / "metrics.csv", [{c: 1 for c in cols} | {"mfu": None}], cols)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "summary.json"]
    run = records.read_run(tmp_path)
    assert run["summary"]["x"] == 1.5 and run["metrics"][0]["eval_acc"] == 1 and run["metrics"][0]["mfu"] is None
    assert records.is_complete(tmp_path)
    assert cols.index("train_acc") == cols.index("eval_loss") + 1


@pytest.mark.integration
def test_records_honour_the_umask(tmp_path):
    """mkstemp makes 0600 files; a group's shared project directory must still read the records."""
    import os
    import stat
    import subprocess
    import sys

    code = (
        "import os, sys; os.umask(int(sys.argv[2], 8)); from kernels.records import schema as records; "
        "records.write_json(__import__('pathlib').Path(sys.argv[1]), {'status': 'complete'})"
    )
    for mask, mode in (("022", 0o644), ("002", 0o664), ("077", 0o600)):
        path = tmp_path / f"summary-{mask}.json"
        subprocess.run([sys.executable, "-c", code, str(path), mask], cwd=ROOT, check=True)
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, (mask, oct(os.stat(path).st_mode))
