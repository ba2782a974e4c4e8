"""Link figures as people write them: bandwidths and latencies with units.

Bandwidths take units (``10Gbps``, ``100 Mbps``, ``1.25GB/s``, ``25 Gb/s``; b: bits, B: bytes),
latencies too (``30ms``, ``5us``, ``0.5s``). In a link mapping the keys ``bandwidth`` and
``latency`` need a unit (a bare number there is ambiguous: Gb/s or GB/s? ms or us?), and
``bandwidth_GBps`` / ``latency_us`` take plain numbers. Cluster files (costmodels.topology), sites
files (costmodels.sites) and what-if sweeps read them here.
"""

from __future__ import annotations

import re
from typing import Mapping

from costmodels.errors import SpecError
from costmodels.hardware import GB, LARGEST, US

# (a sign is read, so that -1 or -5us is refused as out of range, not as unreadable)
_NUMBER = re.compile(r"^\s*[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*$")
_BW = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMGT]?)(bps|b/s|B/s|Bps)\s*$")
_LAT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_bandwidth(value, where: str) -> float:
    """``"10Gbps"`` / ``"1.25GB/s"`` / a number (or its text) of GB/s -> bytes per second."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: expected a bandwidth like 10Gbps or 1.25GB/s, got {value!r}")
    if isinstance(value, (int, float)) or _NUMBER.match(str(value)):
        bps = float(value) * GB
    else:
        m = _BW.match(str(value))
        if not m:
            raise SpecError(f"{where}: expected a bandwidth like 10Gbps, 100Mbps or 1.25GB/s, got "
                            f"{value!r}")
        bps = float(m.group(1)) * _SCALE[m.group(2)]
        if m.group(3) in ("bps", "b/s"):
            bps /= 8
    if bps <= 0:
        raise SpecError(f"{where}: must be positive, got {value!r}; give a bandwidth above 0, "
                        "like 10Gbps or 1.25GB/s")
    if bps > LARGEST * GB:
        raise SpecError(f"{where}: expected a positive bandwidth up to {LARGEST:g} GB/s, got "
                        f"{value!r}")
    return bps


def parse_latency(value, where: str) -> float:
    """``"30ms"`` / ``"5us"`` / a number of microseconds -> seconds."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: expected a latency like 30ms or 5us, got {value!r}")
    if isinstance(value, (int, float)):
        s = float(value) * US
    else:
        m = _LAT.match(str(value))
        if not m:
            raise SpecError(f"{where}: expected a latency like 30ms, 5us or 0.2s, got {value!r}")
        s = float(m.group(1)) * _TIME[m.group(2)]
    if not 0 <= s <= 60:
        raise SpecError(f"{where}: expected a latency from 0 to 60 s, got {value!r}")
    return s


def link_figures(spec: Mapping, where: str) -> tuple[float, float]:
    """(bytes per second, seconds) of a link mapping: ``bandwidth`` and ``latency`` with units, or
    ``bandwidth_GBps`` and ``latency_us`` as plain numbers (one of each)."""
    if "bandwidth" in spec and "bandwidth_GBps" in spec:
        raise SpecError(f"{where}: give bandwidth or bandwidth_GBps, not both")
    if "latency" in spec and "latency_us" in spec:
        raise SpecError(f"{where}: give latency or latency_us, not both")
    plain = "bandwidth_GBps" in spec or "latency_us" in spec  # (the example in the form used)
    if "bandwidth" not in spec and "bandwidth_GBps" not in spec:
        raise SpecError(f"{where}.bandwidth: missing (e.g. " + (
            "bandwidth_GBps: 50)" if plain else "bandwidth: 400Gbps)"))
    if "latency" not in spec and "latency_us" not in spec:
        raise SpecError(f"{where}.latency: missing (e.g. " + (
            "latency_us: 5" if plain else "latency: 5us") + "; a link between sites: tens of ms)")
    # the plain keys take plain numbers, the unit keys a unit: a bare number there is ambiguous
    # (Gb/s or GB/s? ms or us?)
    for plain, unit, example in (("bandwidth_GBps", "bandwidth", "200Gbps"),
                                 ("latency_us", "latency", "10us")):
        value = spec.get(plain)
        if isinstance(value, str) and not _NUMBER.match(value):
            if not value.strip()[:1].isdigit() and not value.strip().startswith("."):
                raise SpecError(f"{where}.{plain}: {value!r} is not a number; give a plain "
                                f"number for {plain}, or {unit} with its unit (like {example})")
            raise SpecError(f"{where}.{plain}: {value!r} has a unit; give {unit}: {value} (like "
                            f"{example}), or a plain number for {plain}")
    for key, example, plain in (("bandwidth", "10Gbps or 1.25GB/s", "bandwidth_GBps"),
                                ("latency", "30ms or 5us", "latency_us")):
        value = spec.get(key)
        if value is not None and not isinstance(value, bool) and (
                isinstance(value, (int, float)) or _NUMBER.match(str(value))):
            raise SpecError(f"{where}.{key}: {value!r} has no unit; write it with one, like "
                            f"{example}, or give {plain}: {value} for a plain number")
    bw = (parse_bandwidth(spec["bandwidth"], f"{where}.bandwidth") if "bandwidth" in spec
          else parse_bandwidth(spec["bandwidth_GBps"], f"{where}.bandwidth_GBps"))
    lat = (parse_latency(spec["latency"], f"{where}.latency") if "latency" in spec
           else parse_latency(spec["latency_us"], f"{where}.latency_us"))
    return bw, lat
