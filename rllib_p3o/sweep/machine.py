"""The machine a sweep's trials ran on, as each trial file records it (`rllib_p3o.sweep.report.MACHINE`).

Trials of one set that ran on different CPUs differ in every float (another vector instruction set rounds
differently, `rllib_p3o.sweep.compare`), and a results page names the machine its numbers come from: the files
say which, not the page's author.
"""

from __future__ import annotations

import platform
from typing import Iterable, Tuple

CPUINFO = "/proc/cpuinfo"
# The widest vector instruction set the torch CPU kernels use, as its /proc/cpuinfo flag and its name.
VECTOR_ISAS: Tuple[Tuple[str, str], ...] = (("avx512f", "AVX-512"), ("avx2", "AVX2"))


def describe_cpu(model_name: str, flags: Iterable[str]) -> str:
    """``"<model name> with <ISA>"``, e.g. ``"AMD EPYC with AVX-512"``; the ISA is the widest of `VECTOR_ISAS`."""
    flags = set(flags)
    isa = next((name for flag, name in VECTOR_ISAS if flag in flags), "no AVX2")
    return f"{model_name.strip() or platform.machine()} with {isa}"


def cpu_description(cpuinfo: str = CPUINFO) -> str:
    """This machine's CPU (`describe_cpu`), read from ``/proc/cpuinfo``; the platform's name elsewhere."""
    try:
        with open(cpuinfo) as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
    except OSError:
        return platform.machine() or "unknown"
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return describe_cpu(fields.get("model name", ""), fields.get("flags", "").split())
