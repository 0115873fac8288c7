"""I/O accounting: what each rank read and waited for, and the record's I/O section over all ranks.

Each rank counts its own timed steps' data wait and step time; the data source counts its bytes,
reads and read time (`stats()`, see kernels/data/pipeline.py's source contract). The counters
go into every checkpoint, so a resumed run's I/O figures cover all its attempts.
"""

from __future__ import annotations

from kernels.base import sysinfo
from kernels.run.metrics import rounded


class IOAccount:
    def __init__(self, src, rank: int, device_name: str):
        self.src, self.rank, self.device_name = src, rank, device_name
        self.local = {"wait_ms": 0.0, "step_ms": 0.0, "steps": 0}  # this rank's own timed steps

    def add_epoch(self, wait: list[float], comp: list[float]) -> None:
        self.local["wait_ms"] += sum(wait)
        self.local["step_ms"] += sum(w + c for w, c in zip(wait, comp))
        self.local["steps"] += len(wait)

    def restore(self, mine: dict | None) -> None:
        """A checkpoint's counters of this rank (and its source's position in the stream)."""
        if mine:
            self.local = {k: mine.get(k, 0) for k in self.local}
            self.src.restore(mine.get("source"))

    def state(self) -> dict:
        return {
            "rank": self.rank,
            "host": sysinfo.host(),
            "device_name": self.device_name,
            **self.local,
            "source": self.src.stats(),
        }

    def summary(self, ranks: list[dict], rows: list[dict]) -> dict:
        """The record's I/O section: per rank and in total (see results/README.md)."""
        train_s = sum(r["epoch_s"] for r in rows)
        per_rank = []
        for r in sorted(ranks, key=lambda r: r["rank"]):
            src = r["source"] or {}
            b, t = src.get("bytes_read"), src.get("read_s")
            per_rank.append(
                {
                    "rank": r["rank"],
                    "host": r["host"],
                    "device_name": r["device_name"],
                    "samples": src.get("samples"),
                    "bytes_read": b,
                    "read_s": rounded(t, 4),
                    "read_calls": src.get("read_calls"),
                    "read_mb_s": rounded(b / t / 1e6 if b and t else None),
                    "data_wait_frac": rounded(r["wait_ms"] / r["step_ms"] if r["step_ms"] else None, 5),
                    "bytes_by_epoch": src.get("bytes_by_epoch"),
                }
            )
        first = (ranks[0]["source"] or {}) if ranks else {}
        data_bytes = first.get("data_bytes")
        streamed = [p["bytes_read"] for p in per_rank if p["bytes_read"] is not None]
        total = sum(streamed) if streamed and len(streamed) == len(per_rank) else None
        by_epoch: dict[str, int] = {}
        for p in per_rank:
            for e, v in (p["bytes_by_epoch"] or {}).items():
                by_epoch[e] = by_epoch.get(e, 0) + v
        waits = [p["data_wait_frac"] for p in per_rank if p["data_wait_frac"] is not None]
        return {
            "source": first.get("source") or self.src.describe().get("source"),
            "cache": first.get("cache"),
            "data_bytes": data_bytes,
            "train_s": rounded(train_s, 4),
            "bytes_read": total,
            "read_ratio_max_epoch": rounded(
                max(by_epoch.values()) / data_bytes if by_epoch and data_bytes else None, 5
            ),
            "read_mb_s": rounded(total / train_s / 1e6 if total and train_s else None),
            "storage_mb_s": rounded(
                sum(p["read_mb_s"] for p in per_rank) if total and all(p["read_mb_s"] for p in per_rank) else None
            ),
            "data_wait_frac_max": rounded(max(waits) if waits else None, 5),
            "data_wait_frac_min": rounded(min(waits) if waits else None, 5),
            "ranks": per_rank,
        }
