"""Measure this device's peaks: matmul FLOP/s per fast dtype and copy bandwidth.

The roofline needs the machine's ceilings. Datasheet numbers are rarely what
PyTorch reaches on a given CPU with a given thread count, so graphprof
measures them once (``graphprof calibrate``): the best of several large
matmuls (2*n^3 FLOPs each) per dtype the device runs fast, and the best of
several large copies (read + write bytes). Results are cached per device
name, thread count and torch version in the user cache directory, and every
profile taken afterwards records them in ``meta.peaks``.

On an accelerator (``--device cuda``, or any other torch.accelerator
backend) the same measurements run on the device, timed on the host around
``torch.accelerator.synchronize``; the sizes grow (8192^3 matmuls, 1 GiB
copies) so that launch and synchronisation latency stay in the noise.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from typing import Callable

import torch

from graphprof.runtime.allocator import accelerator_type
from graphprof.runtime.device_clock import device_name

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_path() -> str:
    """``$XDG_CACHE_HOME/graphprof/peaks.json`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "graphprof", "peaks.json")


def device_key(device: str = "cpu") -> str:
    """What a calibration is valid for: device type and name, threads, torch version."""
    if device == "cpu":
        name = platform.processor() or platform.machine()
        threads = torch.get_num_threads()
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


def measure_peaks(device: str = "cpu", matmul_n: int | None = None, copy_mib: int | None = None,
                  repeats: int = 5) -> dict[str, float]:
    """Measured peaks: ``flops_per_s`` (float32), ``flops_per_s_<dtype>``, ``bytes_per_s``."""
    check_device(device)
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


def load_cached(device: str = "cpu") -> dict[str, float] | None:
    """Cached peaks for this device, or None (never measures)."""
    try:
        with open(cache_path(), encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        return None
    entry = cached.get(device_key(device)) if isinstance(cached, dict) else None
    return dict(entry) if isinstance(entry, dict) else None


def calibrate(device: str = "cpu", **options: int) -> dict[str, float]:
    """Measure peaks and store them in the cache (atomically); returns them."""
    peaks = measure_peaks(device, **options)
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if not isinstance(cached, dict):
            cached = {}
    except (OSError, ValueError):
        cached = {}
    cached[device_key(device)] = peaks
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".peaks-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(cached, f, indent=1)
    os.replace(tmp, path)
    return peaks
