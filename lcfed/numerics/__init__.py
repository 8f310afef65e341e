"""Numerics profiles: which CPU kernels torch, numpy and scipy run, so that one seed gives one set of numbers
on any x86-64 CPU, Intel or AMD.

The libraries pick their CPU kernels by the CPU they run on: ATen's dispatch (``ATEN_CPU_CAPABILITY``),
oneDNN's JIT (``ONEDNN_MAX_CPU_ISA``), MKL's code path (``MKL_CBWR``, conditional numerical
reproducibility), OpenBLAS's core (``OPENBLAS_CORETYPE``, numpy's and scipy's BLAS) and numpy's own SIMD
loops (``NPY_DISABLE_CPU_FEATURES``). The ``portable`` profile (the default, ``engine.numerics``) pins
them all: ATen and oneDNN at AVX2, which every x86-64 machine of the last decade runs; MKL on its
``COMPATIBLE`` branch, the only one MKL runs alike on Intel and other vendors' CPUs (its AVX2 branch is
for Intel CPUs only: elsewhere MKL silently takes its own path, which gave AMD other numbers); OpenBLAS
on its Haswell kernels; numpy's loops at x86-64-v3. ``native`` lets the libraries choose (faster on
AVX-512 machines, numbers tied to the CPU). :mod:`lcfed.numerics.fingerprint` checks the result kernel by kernel
(against the references shipped in ``fingerprints/``) and :mod:`lcfed.numerics.provenance` records what produced
a run's numbers; this module, the profile, is a leaf that ``import lcfed`` loads (no torch, no numpy), they are not.

Each library reads its variable once: torch's when the process runs its first kernel (not at ``import
torch``), OpenBLAS's and numpy's when numpy is imported. So every process applies its profile before
those: importing ``lcfed`` applies ``$LCFED_NUMERICS`` (default portable), and the CLI, the engines, the
device and server actors and Tune trials call :func:`activate` with the config's profile. Processes a
private Ray starts inherit the environment; a worker on another node pins itself when it imports
lcfed, and its actors then switch to the config's profile. This module imports no torch and no numpy
at the top: it must run before.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from functools import cache
from typing import Any

PROFILES = ("portable", "native")
#: the profile a process applies on ``import lcfed`` (and that child processes inherit)
ENV_PROFILE = "LCFED_NUMERICS"
#: the variables a profile controls, each read by its library at the process's first kernel
KEYS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS",
        "NPY_DISABLE_CPU_FEATURES", "CUBLAS_WORKSPACE_CONFIG")
PORTABLE_LEVEL = "AVX2"
_PINNED: dict[str, str | None] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # COMPATIBLE: MKL's one branch that runs alike on every vendor's CPU (SSE2, no approximate rcpps/rsqrtps);
    # STRICT: bitwise equal whatever the arrays' alignment
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's and scipy's OpenBLAS: AVX2 kernels, not SkylakeX's or Zen's
    "OPENBLAS_NUM_THREADS": "1",  # its threaded GEMM sums in an order that follows the core count
    "NPY_DISABLE_CPU_FEATURES": None,  # numpy's SIMD loops above x86-64-v3 (by numpy version: _numpy_above)
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # deterministic cuBLAS (read at its first call; no effect on CPU)
}
#: an x86-64 CPU without AVX2 (or FMA) runs the baseline kernels: the same on every such machine
_FALLBACK: dict[str, str | None] = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "OPENBLAS_CORETYPE": "Nehalem",
    "OPENBLAS_NUM_THREADS": "1",
    "NPY_DISABLE_CPU_FEATURES": None,
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
#: numpy's dispatch targets above each level (numpy >= 2.4 names them by x86-64 level)
_NUMPY_ABOVE = {"AVX2": "X86_V4 AVX512_ICL AVX512_SPR", "DEFAULT": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"}


@cache
def _numpy_above(level: str) -> str | None:
    """The value of ``NPY_DISABLE_CPU_FEATURES`` that keeps numpy at ``level``; None (unset) for a numpy
    older than 2.4, whose targets have other names (a name numpy lacks makes it print a warning)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(p) for p in version("numpy").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return None
    return _NUMPY_ABOVE[level] if (major, minor) >= (2, 4) else None


#: the outer values of :data:`KEYS` (JSON), for child processes, which inherit the pinned ones
ENV_OUTER = "LCFED_NUMERICS_OUTER"


def _outer() -> dict[str, str | None]:
    """The outer environment's values, as they were before lcfed changed any (in this process or the
    one that started it): what ``native`` restores."""
    try:
        saved = json.loads(os.environ.get(ENV_OUTER, ""))
        if isinstance(saved, dict):
            return {key: saved.get(key) if isinstance(saved.get(key), str) else None for key in KEYS}
    except ValueError:
        pass
    outer = {key: os.environ.get(key) for key in KEYS}
    os.environ[ENV_OUTER] = json.dumps(outer)
    return outer


_OUTER = _outer()
_state: dict[str, str] = {}


class NumericsError(ValueError):
    """An unknown profile name (the config's validation names the field)."""


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


@cache
def _cpuinfo(*prefixes: str) -> str | None:
    """The value of the first /proc/cpuinfo line starting with one of ``prefixes`` (Linux); None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(prefixes):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux), empty where they cannot be read."""
    return frozenset((_cpuinfo("flags", "Features") or "").split())


def cpu_model() -> str:
    """E.g. ``AMD EPYC 7B13``; ``platform.processor()`` where /proc/cpuinfo has no model name."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... (Linux); '' where /proc/cpuinfo does not say."""
    return _cpuinfo("vendor_id") or ""


def cpu_isa() -> str:
    """The widest vector extension the CPU has, as torch names its kernel levels."""
    flags = cpu_flags()
    if not is_x86():
        return platform.machine() or "unknown"
    if "avx512f" in flags and "avx512bw" in flags and "avx512vl" in flags and "avx512dq" in flags:
        return "AVX512"
    if "avx2" in flags and "fma" in flags:
        return "AVX2"
    return "DEFAULT" if flags else "unknown"


def pinned_env(profile: str) -> tuple[dict[str, str | None], str]:
    """The variables ``profile`` sets on this machine (None = unset) and a note when the portable level
    cannot run here ('' otherwise)."""
    if profile not in PROFILES:
        raise NumericsError(f"numerics profile {profile!r}: must be one of {list(PROFILES)}")
    if profile == "native":
        return dict(_OUTER), ""
    if not is_x86():
        return dict(_OUTER), (f"portable numerics pin x86-64 kernels; this {platform.machine()} CPU runs its own "
                              "(numbers close to an x86-64 machine's, not identical)")
    isa = cpu_isa()
    if isa in ("AVX2", "AVX512"):
        return {**_PINNED, "NPY_DISABLE_CPU_FEATURES": _numpy_above("AVX2")}, ""
    if isa == "unknown":
        return dict(_OUTER), "portable numerics: this CPU's features cannot be read; torch picks its kernels"
    return {**_FALLBACK, "NPY_DISABLE_CPU_FEATURES": _numpy_above("DEFAULT")}, (
        "portable numerics: this CPU lacks AVX2/FMA; it runs torch's baseline kernels "
        "(the same on every such CPU, not the AVX2 machines' numbers)")


def worker_env(profile: str) -> dict[str, str]:
    """The variables a process started elsewhere needs in its environment from its start to run ``profile``
    (a Ray worker on another node imports numpy before lcfed: OpenBLAS and numpy read theirs then)."""
    if profile != "portable":
        return {}
    env, _ = pinned_env(profile)
    return {**{k: v for k, v in env.items() if v is not None}, ENV_PROFILE: profile}


def activate(profile: str = "portable") -> dict[str, str]:
    """Apply ``profile`` to this process (and the processes it starts), overriding the outer
    environment's kernel settings; returns :func:`state`.

    Must come before the process's first tensor op. When torch already chose its kernels (some
    earlier code ran one), the level in force is kept and reported: one line on stderr, and the same
    note in the run's record.
    """
    env, note = pinned_env(profile)
    _set_env(env, profile)
    expected = (env.get("ATEN_CPU_CAPABILITY") or "").upper() if profile == "portable" else ""
    level = kernel_level()
    if expected and level != expected:
        note = (f"portable numerics: torch chose its {level} kernels before lcfed could pin {expected} "
                "(a tensor op ran first); this process's numbers follow its CPU")
    elif profile == "portable" and not note:
        note = _loaded_early(env)
    if profile == "portable":
        _blas_limited()
    changed = _state.get("profile") != profile or _state.get("note", "") != note
    _state.update(profile=profile, level=level, note=note)
    if note and changed:
        print(f"lcfed: {note}", file=sys.stderr, flush=True)
    return state()


def _loaded_early(env: dict[str, str | None]) -> str:
    """A note when numpy's OpenBLAS or SIMD loops were loaded (this process imported numpy under another
    profile, e.g. ``$LCFED_NUMERICS=native``) with other kernels than ``env`` pins; '' otherwise."""
    if "numpy" not in sys.modules:
        return ""
    core = (env.get("OPENBLAS_CORETYPE") or "").lower()
    cores = openblas_cores()
    above = set((env.get("NPY_DISABLE_CPU_FEATURES") or "").split())
    simd = numpy_simd()
    if (not core or {c.strip().lower() for c in cores.split(",")} <= {core, "none", "unknown"}) and \
            not above & set(simd.split()):
        return ""
    return (f"portable numerics: numpy was loaded before this profile applied (OpenBLAS {cores}, numpy {simd}); "
            "numpy's and scipy's kernels follow this CPU in this process (set $LCFED_NUMERICS=portable)")


#: per threadpoolctl scan (``limit``, ``cores``), the process's shared libraries when it last ran: the scan takes about
#: 10 ms, and every run, actor and trial calls :func:`activate`; no new library, nothing new to find
_scanned: dict[str, object] = {}


@cache
def _link_map_reader() -> Any:
    """A reader of the dynamic linker's count of shared objects loaded and unloaded so far (glibc's
    ``dl_iterate_phdr``: ``dlpi_adds + dlpi_subs`` of its first object; a 2 µs call, where reading
    ``/proc/self/maps`` takes milliseconds in a process that imported torch); None where there is none. Made on
    first use: ctypes only when needed."""
    if sys.platform != "linux":
        return None
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p), ("phdr", ctypes.c_void_p),
                    ("phnum", ctypes.c_uint16), ("adds", ctypes.c_ulonglong), ("subs", ctypes.c_ulonglong)]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)
    def first(info: Any, size: int, _data: Any) -> int:  # its return value is dl_iterate_phdr's; non-zero stops it
        if size < ctypes.sizeof(Info):  # a libc without the counters
            return -1
        return int(min(info.contents.adds + info.contents.subs, 2**31 - 1))

    try:
        iterate = ctypes.CDLL(None).dl_iterate_phdr
    except (OSError, AttributeError):
        return None
    iterate.restype = ctypes.c_int

    def read() -> int | None:  # its closure keeps the C callback alive as long as the reader
        count = int(iterate(first, None))
        return count if count > 0 else None

    return read if read() is not None else None


def _libraries() -> object:
    """What tells this process's set of shared libraries apart from an earlier one: the linker's count
    (:func:`_link_map_reader`), else the objects ``/proc/self/maps`` names; None where neither can be read."""
    read = _link_map_reader()
    if read is not None:
        return ("count", read())
    try:
        with open("/proc/self/maps") as f:
            return frozenset(line.rsplit(" ", 1)[-1] for line in f.read().splitlines() if ".so" in line)
    except OSError:
        return None


def _new_libraries(scan: str) -> bool:
    """Whether this process loaded or unloaded libraries since ``scan`` last ran (always, where that cannot be
    told); ``scan`` counts as run now."""
    libs = _libraries()
    if libs is not None and _scanned.get(scan) == libs:
        return False
    _scanned[scan] = libs
    return True


def _blas_limited() -> None:
    """numpy's BLAS on one thread (:func:`_one_blas_thread`) once numpy is loaded, again only after new libraries."""
    if "numpy" in sys.modules and _new_libraries("limit"):
        _one_blas_thread()


def _one_blas_thread() -> None:
    """numpy's BLAS on one thread in this process, whatever its environment said when numpy loaded."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")  # kept until the process ends (not a context here)


def activate_from_env() -> None:
    """What ``import lcfed`` does: the profile of ``$LCFED_NUMERICS`` (default portable), without
    locking torch's kernels in yet (torch may not even be imported)."""
    profile = env_profile(warn=True)
    _set_env(pinned_env(profile)[0], profile)


def env_profile(warn: bool = False) -> str:
    """The profile ``$LCFED_NUMERICS`` names (default portable; an unknown name counts as portable)."""
    profile = os.environ.get(ENV_PROFILE, "portable").strip().lower() or "portable"
    if profile in PROFILES:
        return profile
    if warn:
        print(f"lcfed: ${ENV_PROFILE}={profile!r} is not one of {list(PROFILES)}; using portable",
              file=sys.stderr, flush=True)
    return "portable"


def _set_env(env: dict[str, str | None], profile: str) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    os.environ[ENV_PROFILE] = profile


def kernel_level() -> str:
    """ATen's kernel level in force (``AVX2``, ``AVX512``, ``DEFAULT``, ...); asking fixes it."""
    import torch  # torch after the profile's settings are in the environment

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # very old torch
        return "unknown"


def openblas_cores() -> str:
    """The cores OpenBLAS runs for the numpy and scipy loaded in this process (e.g. ``Haswell``), as
    threadpoolctl reads them; ``none`` when no OpenBLAS is loaded."""
    global _cores
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown"
    if _new_libraries("cores"):
        cores = sorted({str(i.get("architecture")) for i in threadpool_info() if i.get("internal_api") == "openblas"})
        _cores = ", ".join(cores) or "none"
    return _cores


#: :func:`openblas_cores`' last answer (:data:`_scanned`)
_cores = ""


def numpy_simd() -> str:
    """numpy's SIMD dispatch targets in force in this process (e.g. ``X86_V3``: x86-64-v3 loops)."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    umath = core._multiarray_umath
    targets = [t for t in getattr(umath, "__cpu_dispatch__", []) if umath.__cpu_features__.get(t)]
    return " ".join(targets) or "baseline"


def kernel_settings() -> dict[str, str]:
    """The kernels in force in this process: ATen's level, oneDNN's and MKL's settings, OpenBLAS's cores
    and numpy's SIMD targets (each as the library took it, where it can be read back)."""
    return {"kernels": kernel_level(), "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "native"),
            "mkl_cbwr": os.environ.get("MKL_CBWR", "native"), "openblas": openblas_cores(), "numpy_simd": numpy_simd()}


def state() -> dict[str, str]:
    """The profile this process runs under: ``profile``, ``level`` and ``note`` ('' when none)."""
    if not _state:
        activate(env_profile())
    return dict(_state)


def deterministic_gpu() -> None:
    """Under the portable profile, the GPU's deterministic switches: cuDNN's deterministic
    algorithms, no autotuning, and torch's deterministic implementations (a warning where an op
    has none). GPU numbers are then repeatable on one GPU model and software stack, and close,
    not identical, to the CPU's."""
    import torch  # torch after the profile's settings are in the environment

    if _state.get("profile", env_profile()) != "portable":
        return
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
