"""Readers, verification and the sharding contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.data import cifar10, load_image_dataset
from kernels.data.embedded import load_digits
from kernels.data.pipeline import (
    EvalSource,
    ImageTransform,
    LoaderSource,
    Split,
    TensorSource,
    epoch_permutation,
    rank_slice,
    steps_per_epoch,
)
from kernels.base.params import ConfigError

from conftest import write_cifar_tarball

pytestmark = pytest.mark.unit


def test_cifar_fetch_from_url_verifies_and_reads_real_format(cifar_root):
    root, truth, sums = cifar_root
    arrays = cifar10.read(root, expected=sums)
    for split in ("train", "test"):
        x, y = arrays[split]
        assert x.dtype == np.uint8 and x.shape[1:] == (3, 32, 32)
        np.testing.assert_array_equal(x, truth[split][0])
        np.testing.assert_array_equal(y, truth[split][1])
    assert len(arrays["train"][0]) == 5 * 40 and len(arrays["test"][0]) == 40


def test_cifar_tarball_checksum_mismatch_is_a_clear_error(tmp_path):
    src, _ = write_cifar_tarball(tmp_path / "src", per_batch=4)
    with pytest.raises(ConfigError, match=r"checksum mismatch for .*cifar-10-python.tar.gz"):
        cifar10.fetch(tmp_path / "data", url=src.as_uri(), md5="0" * 32)
    assert not cifar10.batch_dir(tmp_path / "data").exists()


def test_corrupt_batch_file_detected_before_a_run(cifar_root):
    root, _, sums = cifar_root
    f = cifar10.batch_dir(root) / "data_batch_3"
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ConfigError) as e:
        cifar10.verify(root, sums)
    msg = str(e.value)
    assert "data_batch_3" in msg and "checksum mismatch" in msg and "lab fetch cifar10" in msg


def test_missing_cifar_names_the_fetch_command(tmp_path):
    with pytest.raises(ConfigError, match=r"lab fetch cifar10"):
        cifar10.verify(tmp_path)


def test_offline_download_failure_is_clear(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot download .*Offline\?"):
        cifar10.fetch(tmp_path, url=(tmp_path / "nowhere.tar.gz").as_uri())


def test_hand_placed_directory_is_checked_against_official_md5s(cifar_root):
    root, _, _ = cifar_root
    with pytest.raises(ConfigError, match="expected c99cafc152244af753f735de768cd75f"):
        cifar10.verify(root)


def test_embedded_digits_are_cifar_shaped_and_fixed():
    a = load_digits()
    xtr, ytr = a["train"]
    xte, yte = a["test"]
    assert xtr.shape == (1437, 3, 32, 32) and xte.shape == (360, 3, 32, 32) and xtr.dtype == np.uint8
    assert set(np.unique(ytr)) == set(range(10))
    assert xtr.max() == 255 and xtr.min() == 0
    b = load_digits()
    np.testing.assert_array_equal(a["test"][0], b["test"][0])  # the split does not move between runs


@pytest.mark.parametrize("n,batch,world", [(100, 12, 1), (100, 12, 2), (100, 12, 3), (64, 16, 4), (37, 6, 2)])
def test_ranks_together_see_each_sample_once_per_epoch(n, batch, world):
    """Every epoch: floor(n/B)*B distinct samples over all ranks; the n mod B dropped differ by epoch."""
    dropped = []
    for epoch in range(3):
        perm = epoch_permutation(n, seed=7, epoch=epoch)
        seen = []
        for step in range(steps_per_epoch(n, batch)):
            parts = [perm[rank_slice(step, batch, r, world)] for r in range(world)]
            assert all(len(p) == batch // world for p in parts)
            seen += torch.cat(parts).tolist()
        assert len(seen) == len(set(seen)) == (n // batch) * batch
        dropped.append(frozenset(range(n)) - set(seen))
        assert len(dropped[-1]) == n % batch
    if n % batch:
        assert len(set(dropped)) > 1


def _tiny_split(n=48):
    g = torch.Generator().manual_seed(1)
    return Split(torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8), torch.arange(n))


AUG = ImageTransform(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), pad=2, flip=True)


@pytest.mark.integration  # DataLoader worker processes
def test_pipeline_batches_independent_of_world_size_and_of_pipeline():
    """The global batch (samples and augmentation) is the same for 1 or 2 ranks and for both pipelines."""
    split, dev = _tiny_split(), torch.device("cpu")
    one = TensorSource(split, AUG, 16, 0, 1, 3, dev, False)
    two = [TensorSource(split, AUG, 16, r, 2, 3, dev, False) for r in range(2)]
    loader = [LoaderSource(split, AUG, 16, r, 2, 3, dev, False, num_workers=w) for r, w in ((0, 0), (1, 2))]
    for epoch in (0, 1):
        ref = list(one.batches(epoch))
        halves = [list(p.batches(epoch)) for p in two]
        lhalves = [list(p.batches(epoch)) for p in loader]
        assert len(ref) == 3
        for s, (x, y) in enumerate(ref):
            torch.testing.assert_close(torch.cat([halves[0][s][0], halves[1][s][0]]), x, rtol=0, atol=0)
            torch.testing.assert_close(torch.cat([halves[0][s][1], halves[1][s][1]]), y)
            torch.testing.assert_close(torch.cat([lhalves[0][s][0], lhalves[1][s][0]]), x, rtol=0, atol=0)
    # resuming mid-epoch yields exactly the remaining batches
    tail = list(one.batches(1, start_step=1))
    torch.testing.assert_close(tail[0][0], list(one.batches(1))[1][0])
    # the augmentation really varies: between epochs, and within a batch (not one draw per batch)
    assert not torch.equal(list(one.batches(0))[0][0], list(one.batches(1))[0][0])
    draws = AUG.epoch_draws(3, 16, 3, 0, dev)
    assert all(d.shape == (3, 16) for d in draws) and draws[2].any() and not draws[2].all()


def test_device_source_step_has_no_host_sync():
    """The per-step work of the resident source (indexing, crop, flip, normalise) never asks the device for data.

    Run on the meta device, where tensors have shapes and no data: any data-dependent
    branch (`bool(flip.any())`, `.item()`, a copy to the host) raises there. Host syncs
    cannot be counted on a CPU otherwise (torch.cuda.set_sync_debug_mode is CUDA-only;
    the GPU validation counts them on a GPU).
    """
    meta = torch.device("meta")
    src = TensorSource(_tiny_split(), AUG, 16, 1, 2, 3, torch.device("cpu"), False)
    x = torch.empty(48, 3, 8, 8, dtype=torch.uint8, device=meta)
    y = torch.empty(48, dtype=torch.long, device=meta)
    perm = torch.empty(48, dtype=torch.long, device=meta)
    draws = tuple(torch.empty(3, 16, dtype=t, device=meta) for t in (torch.long, torch.long, torch.bool))
    xb, yb = src.rank_batch(x, y, perm, draws, 2, AUG.constants(meta))
    assert xb.shape == (8, 3, 8, 8) and xb.device == meta and xb.dtype == torch.float32 and yb.shape == (8,)
    with pytest.raises(RuntimeError, match="meta"):  # the check is real: a sync does fail on meta tensors
        bool(draws[2].any())


def test_random_transforms_are_drawn_once_per_epoch():
    calls = []

    class Counting(ImageTransform):
        def epoch_draws(self, *args):
            calls.append(args)
            return super().epoch_draws(*args)

    src = TensorSource(_tiny_split(), Counting(**AUG.__dict__), 16, 0, 1, 3, torch.device("cpu"), False)
    assert len(list(src.batches(0))) == 3 and len(calls) == 1
    list(src.batches(1, start_step=1))
    assert len(calls) == 2 and calls[1][3] == 1  # (steps, global batch, seed, epoch, device)


def test_augmentation_crops_within_padding_and_flips():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.uint8).reshape(2, 1, 4, 4)
    from kernels.data.pipeline import crop_flip

    same = crop_flip(x, 1, torch.tensor([1, 1]), torch.tensor([1, 1]), torch.tensor([False, True]))
    assert torch.equal(same[0], x[0]) and torch.equal(same[1], x[1].flip(2))
    shifted = crop_flip(x, 1, torch.tensor([0, 2]), torch.tensor([0, 2]), torch.tensor([False, False]))
    assert shifted[0, 0, 0, 0] == 0 and torch.equal(shifted[0, 0, 1:, 1:], x[0, 0, :3, :3])
    assert torch.equal(shifted[1, 0, :3, :3], x[1, 0, 1:, 1:]) and shifted[1, 0, 3].sum() == 0


def test_eval_shards_cover_the_test_set_exactly_once():
    split = _tiny_split(23)
    seen = []
    for r in range(3):
        for _, y in EvalSource(split, AUG, 4, r, 3, torch.device("cpu"), False).batches():
            seen += y.tolist()
    assert sorted(seen) == list(range(23))


def test_synthetic_small_set_and_shapes(tmp_path):
    train, test, k = load_image_dataset("synthetic", tmp_path, samples=256)
    assert len(train) == 256 and train.x.shape[1:] == (3, 32, 32) and k == 10 and len(test) >= 1


@pytest.mark.parametrize("channels_last", [False, True])
def test_chunked_device_batches_equal_the_step_by_step_ones(channels_last):
    """On a GPU the device-resident source transforms many steps' batches at once (fewer launches per step); the
    batches are the same values, for every rank, from any start step, and keep the memory format."""
    g = torch.Generator().manual_seed(3)
    train = Split(
        torch.randint(0, 256, (203, 3, 8, 8), generator=g, dtype=torch.uint8), torch.randint(0, 10, (203,), generator=g)
    )
    t = ImageTransform(mean=(120.0, 110.0, 100.0), std=(60.0, 61.0, 62.0), pad=2, flip=True)
    for rank in (0, 1):
        ref = TensorSource(train, t, 16, rank, 2, 5, torch.device("cpu"), channels_last, chunk_bytes=0)
        chunked = TensorSource(
            train, t, 16, rank, 2, 5, torch.device("cpu"), channels_last, chunk_bytes=5 * 4 * 192 * 8
        )
        assert ref.chunk_steps == 1 and chunked.chunk_steps == 5
        for start in (0, 7):
            a, b = list(ref.batches(1, start)), list(chunked.batches(1, start))
            assert len(a) == len(b) == ref.steps_per_epoch - start == 12 - start
            for (xa, ya), (xb, yb) in zip(a, b):
                assert torch.equal(xa, xb) and torch.equal(ya, yb)
                assert xb.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
