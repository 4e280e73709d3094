"""System metrics: a background thread that samples the machine every few seconds into `system` events.

CPU, memory, disk and network through psutil; each GPU's utilisation, memory and power through NVML
(nvidia-ml-py) when a GPU is there; each JAX device's `memory_stats()` when the script uses JAX. The
thread seals its own events into the run's chain (the sink's lock is held for microseconds), so it
never blocks `log`; a sample that fails is skipped with a debug line, never raised into the loop.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import psutil

from runledger.ledger.emit.periodic import Periodic

log = logging.getLogger("runledger.system")


def _gpus() -> list[tuple[str, float]]:
    """(name, value) of every NVIDIA GPU, or [] without NVML or a GPU."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU
        return []
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        util, mem = pynvml.nvmlDeviceGetUtilizationRates(h), pynvml.nvmlDeviceGetMemoryInfo(h)
        out += [(f"gpu/{i}/util_percent", util.gpu), (f"gpu/{i}/memory_used_bytes", mem.used),
                (f"gpu/{i}/memory_total_bytes", mem.total)]
        try:
            out.append((f"gpu/{i}/power_w", pynvml.nvmlDeviceGetPowerUsage(h) / 1000))
        except Exception:  # not every board reports power
            pass
    return out


def _jax_devices() -> list[tuple[str, float]]:
    """Memory of each local JAX device, if the script has imported JAX (never imported here)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return []
    out = []
    for d in jax.local_devices():
        stats = d.memory_stats() or {}  # None on CPU
        for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit"):
            if key in stats:
                out.append((f"jax/{d.platform}{d.id}/{key}", stats[key]))
    return out


def sample(disk: Path, process: psutil.Process) -> dict[str, float]:
    """One sample of the machine: name -> number."""
    vm, du = psutil.virtual_memory(), psutil.disk_usage(str(disk))
    m = {"cpu/percent": psutil.cpu_percent(), "memory/used_bytes": vm.used, "memory/percent": vm.percent,
         "disk/used_bytes": du.used, "disk/percent": du.percent,
         "process/rss_bytes": process.memory_info().rss, "process/cpu_percent": process.cpu_percent(),
         "process/threads": process.num_threads()}
    if io := psutil.disk_io_counters():
        m.update({"disk/read_bytes": io.read_bytes, "disk/write_bytes": io.write_bytes})
    if net := psutil.net_io_counters():
        m.update({"network/sent_bytes": net.bytes_sent, "network/recv_bytes": net.bytes_recv})
    m.update(_gpus())
    m.update(_jax_devices())
    return {k: float(v) for k, v in m.items()}


class SystemSampler(Periodic):
    """Samples every `interval_s` into `sink` as `system` events, until `stop()`."""

    def __init__(self, sink, interval_s: float, disk: Path) -> None:
        super().__init__(interval_s, "runledger-system")
        self.sink = sink
        self.disk = disk if disk.exists() else Path.cwd()
        self._process: psutil.Process | None = None

    def begin(self) -> None:
        self._process = psutil.Process()
        psutil.cpu_percent(), self._process.cpu_percent()  # the first call only sets the baseline

    def tick(self) -> None:
        self.sink.emit_dict("system", {"metrics": sample(self.disk, self._process), "interval_s": self.interval})
