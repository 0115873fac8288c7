"""JupyterLab serves the repository and opens the py:percent sources as notebooks (jupytext)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration


def _get(url: str, token: str):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_lab_jupyter_opens_01_train_py_as_a_notebook(tmp_path):
    from kernels.base.ports import free_port

    port, token = free_port(), secrets.token_hex(8)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernels.cli",
            "jupyter",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 90
        while True:
            try:
                status = _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError):
                assert p.poll() is None, p.stdout.read()
                assert time.time() < deadline, "JupyterLab did not answer within 90 s"
                time.sleep(0.5)
        assert "started" in status
        nb = _get(f"{base}/api/contents/notebooks/01_train.py?type=notebook&content=1", token)
        assert nb["type"] == "notebook" and nb["format"] == "json"
        cells = nb["content"]["cells"]
        tagged = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
        assert len(tagged) == 1 and "gpus = 1" in tagged[0]["source"]
        # the lab's extension list: JupyterLab itself and jupytext
        lab = _get(f"{base}/lab/api/settings/", token)
        assert lab is not None
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    assert p.returncode is not None
