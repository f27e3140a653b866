"""What the GPU's clocks, power and temperature did while a row was timed, read through NVML
(``nvidia-ml-py``), and the limits it runs under.

On the H200 the SM clock was seen dipping from 1980 MHz to 1335-1900 MHz for about 20 s under a
power cap in the middle of a sweep; a kernel timed then is slower for a reason of the machine's, not
the kernel's. :class:`ClockMonitor` samples NVML from a thread while a row is timed; a row during
which a slowdown reason was active is ``throttled``, and the harness times it once more. Without a
GPU or without NVML every reading is None and nothing is flagged.
"""

from __future__ import annotations

import threading
from contextlib import suppress

import numpy as np
import torch

SAMPLE_INTERVAL_S = 0.01

# NVML's clock event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*): the ones that slow a
# busy GPU down. Idle, application-clock and sync-boost bits say nothing about a kernel's speed.
SLOWDOWN_REASONS = {
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}
COLUMNS = ["sm_mhz_min", "sm_mhz_median", "mem_mhz_median", "power_w_max", "temp_c_max", "throttle_reasons",
           "throttled"]


def _nvml():
    """The initialised pynvml module, or None where NVML is not there (no package, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return None
    return pynvml


def _handle(nvml, device: torch.device):
    """NVML's handle of the GPU torch calls ``device``, matched by PCI bus id (NVML ignores
    CUDA_VISIBLE_DEVICES, so the two number GPUs differently)."""
    props = torch.cuda.get_device_properties(device)
    if not hasattr(props, "pci_bus_id"):  # torch too old to say: CUDA's order, right without CUDA_VISIBLE_DEVICES
        return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)


def _reasons(nvml, handle) -> int:
    getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
        or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(getter(handle))


class ClockMonitor:
    """Samples SM and memory clocks, power, temperature and slowdown reasons every 10 ms while the
    ``with`` block runs; :meth:`summary` gives the row's clock columns (:data:`COLUMNS`)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.nvml = _nvml() if self.device.type == "cuda" else None
        self.handle = _handle(self.nvml, self.device) if self.nvml else None
        self.readings: list[tuple[int, int, float, int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        nvml, h = self.nvml, self.handle
        with suppress(Exception):  # a reading NVML refuses is skipped, not fatal to the row
            self.readings.append((nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                                  nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
                                  nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                                  nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                                  _reasons(nvml, h)))

    def _run(self) -> None:
        while True:
            self._read()
            if self._stop.wait(SAMPLE_INTERVAL_S):
                return

    def __enter__(self) -> "ClockMonitor":
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, name="kda-clock-monitor", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._read()  # at least one reading, however short the block

    def summary(self) -> dict:
        if not self.readings:
            return dict.fromkeys(COLUMNS)
        sm, mem, power, temp, reasons = (np.array(column) for column in zip(*self.readings, strict=True))
        seen = np.bitwise_or.reduce(reasons)
        names = [name for bit, name in SLOWDOWN_REASONS.items() if seen & bit]
        return {"sm_mhz_min": int(sm.min()), "sm_mhz_median": float(np.median(sm)),
                "mem_mhz_median": float(np.median(mem)), "power_w_max": float(power.max()),
                "temp_c_max": int(temp.max()), "throttle_reasons": "+".join(names), "throttled": bool(names)}


def merged(summaries: list[dict]) -> dict:
    """One summary of several timings' (a row timed in several processes): the lowest SM clock, the
    median of the medians, the highest power and temperature, every slowdown reason seen."""
    read = [s for s in summaries if s.get("sm_mhz_min") is not None]
    if not read:
        return dict.fromkeys(COLUMNS)
    names = sorted({name for s in read for name in filter(None, (s["throttle_reasons"] or "").split("+"))})
    return {"sm_mhz_min": min(s["sm_mhz_min"] for s in read),
            "sm_mhz_median": float(np.median([s["sm_mhz_median"] for s in read])),
            "mem_mhz_median": float(np.median([s["mem_mhz_median"] for s in read])),
            "power_w_max": max(s["power_w_max"] for s in read), "temp_c_max": max(s["temp_c_max"] for s in read),
            "throttle_reasons": "+".join(names), "throttled": any(s["throttled"] for s in read)}


def gpu_limits(device) -> dict:
    """The power limit and clocks the GPU runs under, for meta.json (empty without NVML)."""
    device = torch.device(device)
    nvml = _nvml() if device.type == "cuda" else None
    if nvml is None:
        return {}
    h = _handle(nvml, device)
    limits = {}
    for name, read in {
        "power_limit_w": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
        "power_default_limit_w": lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1e3,
        "sm_max_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
        "mem_max_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_MEM),
        "sm_application_mhz": lambda: nvml.nvmlDeviceGetApplicationsClock(h, nvml.NVML_CLOCK_SM),
        "mem_application_mhz": lambda: nvml.nvmlDeviceGetApplicationsClock(h, nvml.NVML_CLOCK_MEM),
        "persistence_mode": lambda: bool(nvml.nvmlDeviceGetPersistenceMode(h)),
        "driver": lambda: nvml.nvmlSystemGetDriverVersion(),
    }.items():
        with suppress(Exception):  # a query this GPU or driver does not answer is left out
            limits[name] = read()
    return limits
