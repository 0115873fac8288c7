"""The release's metadata: one version everywhere, citation files that parse, release notes for that version."""

from __future__ import annotations

import json
import re
import pytest
import yaml

from conftest import ROOT
from kernels import __version__

pytestmark = pytest.mark.unit


def test_one_version_in_the_package_the_citation_the_archive_and_the_notes():
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == __version__ and cff["license"] == "BSD-3-Clause"
    assert cff["authors"] and cff["title"] and cff["message"]
    zenodo = json.loads((ROOT / ".zenodo.json").read_text())
    assert zenodo["version"] == __version__ and zenodo["upload_type"] == "software"
    assert zenodo["license"] == cff["license"] and zenodo["creators"]
    notes = (ROOT / "docs" / "release-notes.md").read_text()
    # the newest release's notes are this version's; changes since then wait under "Unreleased" above them
    releases = [h for h in re.findall(r"^## (\S+)", notes, re.M) if h != "Unreleased"]
    assert releases[0] == __version__, "the newest release notes are not this version's"
    # the package metadata reads the version from kernels/__init__.py, not from a copy
    toml = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in toml and 'version = {attr = "kernels.__version__"}' in toml


def test_lab_version_and_the_records_name_it(capsys):
    from kernels.base.sysinfo import software_versions

    assert software_versions(import_torch=False)["lab"] == __version__
    from kernels import cli

    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"scaling-lab {__version__}"
