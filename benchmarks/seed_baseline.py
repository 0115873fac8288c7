"""The usual script: ResNet-18 on CIFAR-shaped data trained the way the seed plans do, for honest ratios.

    python benchmarks/seed_baseline.py --batch 512 --steps 100            # one process
    torchrun --nproc-per-node 8 benchmarks/seed_baseline.py --batch 4096  # DDP over 8 GPUs

What it does, as the seed plans and the PyTorch tutorials do, and deliberately nothing more:
- a per-sample torch Dataset over uint8 HWC images: each sample becomes a PIL image,
  RandomCrop(32, padding=4) and RandomHorizontalFlip with PIL, ToTensor and Normalize
  (torchvision's transforms, written out with PIL and numpy: torchvision is not a dependency);
- a DataLoader with `--workers` worker processes, pin_memory on CUDA, persistent workers,
  a DistributedSampler under DDP;
- the same model as the lab (kernels/workloads/resnet18_cifar.py, CIFAR stem), DDP with its
  defaults (buffers broadcast every forward, gradients copied into buckets), SGD with
  momentum 0.9 (nesterov), weight decay 5e-4 (torch's default for-each kernels);
- torch.autocast for bf16/fp16 (GradScaler for fp16), contiguous NCHW (no channels_last; `--channels_last`
  makes the one-line change such a script can make), no torch.compile; `loss.item()` every step for the running
  loss (a host sync per step).

It prints one JSON line: samples/s as the lab defines it (global batch / median step time over
the timed steps), with p10/p90 and the step times' spread. The data are synthetic, CIFAR-shaped
(kernels/data/embedded.make_synthetic), so no download is needed and both sides read the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.data.embedded import make_synthetic  # noqa: E402
from kernels.workloads.convnets import ResNet18Cifar  # noqa: E402
from kernels.workloads.resnet18_cifar import CIFAR_MEAN, CIFAR_STD, CPU_CHANNELS_LAST_MIN_WIDTH  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class SeedCifar(torch.utils.data.Dataset):
    """Per-sample CIFAR-style dataset: PIL image -> random crop with padding -> random flip -> tensor -> normalise."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, train: bool = True):
        self.images, self.labels, self.train = images, labels, train  # images: N x 32 x 32 x 3 uint8
        self.mean = np.array(CIFAR_MEAN, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.array(CIFAR_STD, dtype=np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        img = Image.fromarray(self.images[i])
        if self.train:
            img = ImageOps.expand(img, border=4, fill=0)  # RandomCrop(32, padding=4)
            x0, y0 = np.random.randint(0, 9, size=2)
            img = img.crop((x0, y0, x0 + 32, y0 + 32))
            if np.random.rand() < 0.5:  # RandomHorizontalFlip()
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0  # ToTensor()
        x = (x - self.mean) / self.std  # Normalize(mean, std)
        return torch.from_numpy(x), int(self.labels[i])


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=512 if cuda else 64, help="global batch (over all ranks)")
    ap.add_argument("--steps", type=int, default=100 if cuda else 30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10 if cuda else 5, help="steps before timing (workers, cuDNN)")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank (the lab's num_workers)")
    ap.add_argument("--width", type=int, default=64 if cuda else 16)
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16" if cuda else "fp32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--channels_last",
        action="store_true",
        help="the one-line change the usual script can make: channels_last model and inputs",
    )
    args = ap.parse_args(argv)

    if args.channels_last and not cuda and args.width < CPU_CHANNELS_LAST_MIN_WIDTH:
        raise SystemExit(
            f"error: --channels_last on a CPU below width {CPU_CHANNELS_LAST_MIN_WIDTH} meets oneDNN's "
            f"channels_last fault (uxlfoundation/oneDNN#6035: a crash or wrong gradients); use --width >= "
            f"{CPU_CHANNELS_LAST_MIN_WIDTH}, or leave --channels_last out"
        )
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank, local = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.batch % world:
        raise SystemExit(f"error: --batch {args.batch} is not divisible by {world} ranks")
    per_rank = args.batch // world
    n = per_rank * world * (args.steps + args.warmup)
    torch.manual_seed(args.seed)
    arrays = make_synthetic(n_train=n, n_test=1)
    images = np.ascontiguousarray(arrays["train"][0].transpose(0, 2, 3, 1))  # NCHW -> HWC images, as CIFAR's files
    data = SeedCifar(images, arrays["train"][1])
    sampler = torch.utils.data.distributed.DistributedSampler(data, seed=args.seed) if world > 1 else None
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=per_rank,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=args.workers,
        pin_memory=cuda,
        persistent_workers=args.workers > 0,
        drop_last=True,
    )
    model = ResNet18Cifar(width=args.width).to(device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    model.train()
    times, running = [], 0.0
    t_last = None
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True).contiguous(memory_format=fmt), y.to(device, non_blocking=True)
        opt.zero_grad()
        with torch.autocast(
            device.type, dtype=DTYPES.get(args.precision, torch.bfloat16), enabled=args.precision in DTYPES
        ):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        running += loss.item()  # the running loss of the usual script: a host sync every step
        now = time.perf_counter()
        if t_last is not None and step >= args.warmup:
            times.append((now - t_last) * 1e3)
        t_last = now
        if step + 1 >= args.warmup + args.steps:
            break
    if world > 1:  # the slowest rank's median bounds the step, as in the lab's records
        t = torch.tensor([statistics.median(times)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        med = float(t)
        dist.destroy_process_group()
    else:
        med = statistics.median(times)
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [med] * 9
    out = {
        "what": "seed-style baseline",
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "world_size": world,
        "batch": args.batch,
        "precision": args.precision,
        "width": args.width,
        "channels_last": args.channels_last,
        "workers": args.workers,
        "timed_steps": len(times),
        "step_ms_p50": round(med, 3),
        "step_ms_p10": round(q[0], 3),
        "step_ms_p90": round(q[-1], 3),
        "samples_per_s": round(args.batch * 1e3 / med, 2),
        "samples_per_s_p10": round(args.batch * 1e3 / q[-1], 2),
        "samples_per_s_p90": round(args.batch * 1e3 / q[0], 2),
        "mean_loss": round(running / max(1, step + 1), 4),
    }
    if rank == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
