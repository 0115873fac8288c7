"""The Horovod wheel cache (`make horovod`): a build is kept once and found again, never a wrong or altered one."""

from __future__ import annotations

import os

import pytest

from kernels.engines import horovod

pytestmark = pytest.mark.unit


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_WHEEL_CACHE", str(tmp_path / "wheels"))
    return tmp_path / "wheels"


def _wheel(tmp_path, body: bytes = b"a wheel") -> os.PathLike:
    w = tmp_path / "built" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    w.parent.mkdir(exist_ok=True)
    w.write_bytes(body)
    return w


def test_the_key_names_everything_the_build_depends_on(monkeypatch):
    import sys

    import torch

    key = horovod.wheel_key(mpi=True, nccl=False)
    assert key.startswith(f"horovod-{horovod.VERSION}-torch{torch.__version__}-cp{sys.version_info.major}")
    assert key.endswith("-gloo-mpi") and horovod.wheel_key(mpi=False, nccl=True).endswith("-gloo-nccl")
    monkeypatch.delenv("LAB_WHEEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert str(horovod.wheel_cache()) == "/somewhere/scaling-lab/wheels"


def test_a_kept_wheel_is_found_again_with_its_checksum(cache, tmp_path):
    horovod._keep_wheel(_wheel(tmp_path), "k")
    found = horovod._cached_wheel("k")
    assert found == cache / "k" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl" and found.read_bytes() == b"a wheel"
    assert (cache / "k" / (found.name + ".sha256")).read_text().split()[0] == horovod.sha256(found)
    assert [p.name for p in (cache / "k").iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert horovod._cached_wheel("another-torch") is None


def test_an_altered_or_linked_wheel_is_not_used(cache, tmp_path):
    horovod._keep_wheel(_wheel(tmp_path), "k")
    found = horovod._cached_wheel("k")
    found.write_bytes(b"something else")  # altered after it was kept: its checksum no longer matches
    assert horovod._cached_wheel("k") is None
    horovod._keep_wheel(_wheel(tmp_path), "k")
    assert horovod._cached_wheel("k") is not None
    found.unlink()
    found.symlink_to(tmp_path / "built" / found.name)  # a link in its place is not followed
    assert horovod._cached_wheel("k") is None


def test_keeping_never_writes_through_a_planted_link(cache, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (cache / "k").mkdir(parents=True)
    name = "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    (cache / "k" / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
    horovod._keep_wheel(_wheel(tmp_path), "k")
    assert victim.read_text() == "precious"
    assert "could not keep the wheel" in capsys.readouterr().out
    assert horovod._cached_wheel("k") is None
