"""What produced a run's numbers (its provenance): the numerics profile and the kernels in force
(:mod:`lcfed.numerics`), the kernel fingerprint (:mod:`lcfed.numerics.fingerprint`), software, CPU, threads and GPU;
and which runs can be compared bit for bit. Every run records it (``provenance`` in ``--json``,
``provenance.*`` tags in MLflow); ``lcfed table`` and ``lcfed compare`` read it back.
"""

from __future__ import annotations

import platform
import re
from functools import cache
from typing import Any

import torch

from lcfed.numerics import cpu_isa, cpu_model, fingerprint, kernel_settings, state


@cache
def _build_info() -> str:
    """``torch.__config__.show()``: how this torch was built (BLAS, oneDNN)."""
    return str(torch.__config__.show())


def _blas() -> str:
    shown = _build_info()
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", shown)
    if mkl:
        return f"MKL {mkl.group(1)}"
    blas = re.search(r"BLAS_INFO=(\w+)", shown)
    return blas.group(1) if blas else "unknown"


def _onednn() -> str:
    found = re.search(r"MKL-DNN v([\w.]+)", _build_info())
    return f"oneDNN {found.group(1)}" if found else "none"


def record(device: Any = None, threads: int | None = None) -> dict[str, str]:
    """What produced a run's numbers: software, CPU and the kernels in force, the kernel fingerprint
    (:mod:`lcfed.numerics.fingerprint`), threads (``threads``: the hosts' intra-op threads where they are not this
    process's), and the GPU and CUDA version when ``device`` is a CUDA device. Flat strings: MLflow tags
    and ``--json``."""
    s = state()
    settings = kernel_settings()
    out = {
        "numerics": s["profile"],
        "kernels": s["level"],
        "onednn_isa": settings["onednn_isa"],
        "mkl_cbwr": settings["mkl_cbwr"],
        "openblas": settings["openblas"],
        "numpy_simd": settings["numpy_simd"],
        "fingerprint": fingerprint.for_process(threads or torch.get_num_threads()).digest,
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),
        "torch": torch.__version__,
        "blas": _blas(),
        "onednn": _onednn(),
        "threads": str(threads or torch.get_num_threads()),
        "interop_threads": str(torch.get_num_interop_threads()),
        "python": platform.python_version(),
    }
    if s["note"]:
        out["numerics_note"] = s["note"]
    if device is not None and getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = str(torch.version.cuda)
        out["cudnn"] = str(torch.backends.cudnn.version())
    return out


#: the provenance fields that decide whether two runs' numbers can be compared bit for bit
SAME_NUMBERS = ("numerics", "kernels", "onednn_isa", "mkl_cbwr", "openblas", "numpy_simd", "fingerprint", "torch",
                "blas", "gpu")


def differences(records: list[dict[str, Any]]) -> list[str]:
    """The :data:`SAME_NUMBERS` fields (``cpu`` too under ``native`` without fingerprints) on which ``records``
    disagree, each as ``field: a, b``; records from before provenance was recorded count as ``unrecorded``."""
    keys = list(SAME_NUMBERS)
    if any(r.get("numerics") == "native" for r in records) and not all(r.get("fingerprint") for r in records):
        keys.append("cpu")
    out = []
    for key in keys:
        values = sorted({str(r.get(key, "unrecorded" if key != "gpu" else "none")) for r in records})
        if len(values) > 1:
            out.append(f"{key}: {', '.join(values)}")
    return out


def fingerprint_groups(records: list[dict[str, Any]], labels: list[str]) -> str:
    """'' when every record has one kernel fingerprint; else the runs by fingerprint, e.g. ``58f37ce63875: a.json,
    b.json; 1c2d3e4f5a6b: c.json`` (``unrecorded`` for a run from before fingerprints were recorded)."""
    groups: dict[str, list[str]] = {}
    for record, label in zip(records, labels, strict=True):
        groups.setdefault(str(record.get("fingerprint") or "unrecorded"), []).append(label)
    if len(groups) < 2:
        return ""
    return "; ".join(f"{digest}: {', '.join(names)}" for digest, names in groups.items())
