"""Downloads with progress, from the first mirror that answers, and checksums of files."""

from __future__ import annotations

import hashlib
import sys
import urllib.request
from pathlib import Path

from kernels.base.errors import NOT_PERMITTED, ConfigError
from kernels.base import files


def _digest(path: Path, algo: str, chunk: int = 1 << 22) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def md5sum(path: Path) -> str:
    return _digest(path, "md5")


def sha256sum(path: Path) -> str:
    return _digest(path, "sha256")


def download(urls: str | list[str], dest: Path, what: str, offline_hint: str) -> str:
    """Fetch the first of `urls` that answers into `dest` (via a .part file); return the URL used.

    Progress goes to stderr every 10 %. When none answers: a ConfigError naming the
    URLs tried and what to do offline.
    """
    urls = [urls] if isinstance(urls, str) else list(urls)
    errors = []
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    for url in urls:
        print(f"downloading {url} -> {dest}", file=sys.stderr, flush=True)
        done = 0
        try:
            with urllib.request.urlopen(url, timeout=60) as r, files.create(tmp, "wb") as f:
                total = int(r.headers.get("Content-Length") or 0)
                done, last = 0, -1
                while block := r.read(1 << 20):
                    f.write(block)
                    done += len(block)
                    pct = int(100 * done / total) if total else -1
                    if pct // 10 != last // 10:
                        print(f"  {done / 1e6:.1f} MB" + (f" ({pct}%)" if total else ""), file=sys.stderr, flush=True)
                        last = pct
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno in (*files.DISK_FULL, *NOT_PERMITTED):  # the local disk's, not the network's
                raise files.write_error(dest, done, e, "--root") from None
            errors.append(f"{url}: {e}")
            continue
        tmp.replace(dest)
        return url
    raise ConfigError(f"{what}: cannot download ({'; '.join(errors)}). Offline? {offline_hint}")
