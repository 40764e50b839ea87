"""Measure this device's peaks: matmul FLOP/s per fast dtype and copy bandwidth.

The roofline needs the machine's ceilings. Datasheet numbers are rarely what
PyTorch reaches on a given CPU with a given thread count, so graphprof
measures them once (``graphprof calibrate``): the best of several large
matmuls (2*n^3 FLOPs each) per dtype the device runs fast, and the best of
several large copies (read + write bytes). Results are cached per device
name, thread count and torch version in the user cache directory, and every
profile taken afterwards records them in ``meta.peaks``.

Threads: CPU peaks depend on ``torch.get_num_threads()``, so
``graphprof calibrate --threads 1 4`` measures each count asked for. A
profile looks up its own thread count; when only other counts were
measured it takes the nearest one and says so in ``meta.peaks_note``, rather than dropping the roofline.

On an accelerator (``--device cuda``, or any other torch.accelerator
backend) the same measurements run on the device, timed on the host around
``torch.accelerator.synchronize``; the sizes grow (8192^3 matmuls, 1 GiB
copies) so that launch and synchronisation latency stay in the noise.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from graphprof.profile.atomic import atomic_file
from graphprof.runtime.allocator import accelerator_type
from graphprof.runtime.device_clock import device_name

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_path() -> str:
    """``$XDG_CACHE_HOME/graphprof/peaks.json`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "graphprof", "peaks.json")


@dataclass(frozen=True)
class Calibration:
    """Cached peaks and the CPU thread count they were measured with (0 on an accelerator)."""

    peaks: dict[str, float]
    threads: int


def device_key(device: str = "cpu", threads: int | None = None) -> str:
    """What a calibration is valid for: device type and name, threads (default: now), torch version."""
    if device == "cpu":
        name = platform.processor() or platform.machine()
        threads = threads or torch.get_num_threads()
    else:
        name = device_name(device)
        threads = 0
        device = device.split(":")[0]  # profiles look peaks up by device type
    return f"{device}|{name}|threads={threads}|torch={torch.__version__}"


def check_device(device: str) -> None:
    """ValueError (one sentence) unless ``device`` is the CPU or this machine's accelerator."""
    if device == "cpu":
        return
    kind = accelerator_type()
    if kind is None or device.split(":")[0] != kind:
        found = f"its accelerator is {kind!r}" if kind else "torch.accelerator finds no accelerator"
        raise ValueError(f"cannot calibrate device {device!r} here: {found} (use --device cpu"
                         f"{' or --device ' + kind if kind else ''})")


def _best_time_s(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Best of ``repeats`` timed runs after one warm-up; with 0 repeats, the warm-up's time."""
    t0 = time.perf_counter()
    fn()
    sync()
    best = time.perf_counter() - t0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


@contextlib.contextmanager
def _threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` CPU threads (None: as set), restoring the count afterwards."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_peaks(device: str = "cpu", matmul_n: int | None = None, copy_mib: int | None = None,
                  repeats: int = 5, threads: int | None = None) -> dict[str, float]:
    """Measured peaks: ``flops_per_s`` (float32), ``flops_per_s_<dtype>``, ``bytes_per_s``."""
    check_device(device)
    if threads is not None and (device != "cpu" or threads < 1):
        raise ValueError("--threads is a CPU thread count of at least 1")
    with _threads(threads):
        return _measure(device, matmul_n, copy_mib, repeats)


def _measure(device: str, matmul_n: int | None, copy_mib: int | None, repeats: int) -> dict[str, float]:
    accelerator = device != "cpu"
    matmul_n = matmul_n or (8192 if accelerator else 1024)
    copy_mib = copy_mib or (1024 if accelerator else 256)
    sync = torch.accelerator.synchronize if accelerator else (lambda: None)
    peaks: dict[str, float] = {}
    float32_best_s = float("inf")  # the bar other dtypes must beat to count as fast
    for name, dtype in _DTYPES.items():
        try:
            # One untimed-quality run first: a dtype slower than float32 is not
            # "run fast" here (fp16 on most CPUs); don't spend repeats on it.
            a = torch.randn(matmul_n, matmul_n, device=device).to(dtype)
            b = torch.randn(matmul_n, matmul_n, device=device).to(dtype)
            seconds = _best_time_s(lambda: torch.mm(a, b), 0 if name != "float32" else repeats, sync)
            if name != "float32":
                if seconds > float32_best_s:
                    continue
                seconds = min(seconds, _best_time_s(lambda: torch.mm(a, b), repeats, sync))
            else:
                float32_best_s = seconds
        except RuntimeError:
            continue  # dtype not supported for matmul here
        peaks[f"flops_per_s_{name}"] = 2 * matmul_n**3 / seconds
    peaks["flops_per_s"] = peaks["flops_per_s_float32"]
    n = copy_mib * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _best_time_s(lambda: dst.copy_(src), repeats, sync)
    peaks["bytes_per_s"] = 2 * src.numel() * src.element_size() / seconds
    return peaks


def _read_cache() -> dict:
    try:
        with open(cache_path(), encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def find_calibration(device: str = "cpu", threads: int | None = None) -> Calibration | None:
    """The cached peaks for ``threads`` (default: now), else for the nearest cached count; never measures."""
    cached = _read_cache()
    wanted = device_key(device, threads)
    prefix, _, rest = wanted.partition("|threads=")
    count, _, suffix = rest.partition("|")
    best: tuple[int, int, dict] | None = None
    for key, entry in cached.items():
        head, _, tail = key.partition("|threads=")
        other, _, other_suffix = tail.partition("|")
        if head != prefix or other_suffix != suffix or not isinstance(entry, dict) or not other.isdigit():
            continue
        distance = abs(int(other) - int(count))
        if best is None or distance < best[0]:
            best = (distance, int(other), entry)
    return None if best is None else Calibration(dict(best[2]), best[1])


def load_cached(device: str = "cpu", threads: int | None = None) -> dict[str, float] | None:
    """Cached peaks for this device and thread count (the nearest cached count), or None."""
    found = find_calibration(device, threads)
    return found.peaks if found is not None else None


def calibrate(device: str = "cpu", threads: int | None = None, **options: int) -> dict[str, float]:
    """Measure peaks (with ``threads`` CPU threads) and store them in the cache (atomically); returns them."""
    peaks = measure_peaks(device, threads=threads, **options)
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cached = _read_cache()
    cached[device_key(device, threads)] = peaks
    with atomic_file(path) as f:
        json.dump(cached, f, indent=1)
    return peaks
