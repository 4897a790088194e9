"""ctypes binding of libspattn: library loading, descriptors, status -> exception mapping."""
from __future__ import annotations

import ctypes
import glob
import operator
import os
import threading
from pathlib import Path
from typing import Optional, Sequence, Tuple

MAX_DIMS = 8

# spattn_dtype
F32, F16, BF16, I32, U8 = 0, 1, 2, 3, 4
DTYPE_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16", I32: "int32", U8: "uint8"}
# spattn_device_type
DEVICE_CPU, DEVICE_CUDA = 1, 2
# status codes used on the Python side
STATUS_SUCCESS = 0
STATUS_BAD_NDIM = 200
STATUS_BAD_SHAPE = 201
STATUS_BAD_DTYPE = 300
STATUS_BAD_STRIDE = 400
STATUS_BAD_DEVICE = 500
STATUS_BACKEND_UNAVAILABLE = 501
STATUS_NOT_SUPPORTED = 700
STATUS_INVALID_VALUE = 101
STATUS_BAD_OPTIONS = 102
STATUS_BAD_INDEX = 600
STATUS_WORKSPACE_TOO_SMALL = 800
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1

SFA_MODE_NONE, SFA_MODE_CAUSAL = 0, 3


class SpattnError(ValueError):
    """A libspattn call (or the binding's own check) rejected its arguments.

    ``status`` is the library's spattn_status code, ``status_name`` its short name and
    ``message`` the spattn_last_error() text naming the argument at fault.
    """

    def __init__(self, status: int, message: str, status_name: Optional[str] = None):
        self.status = int(status)
        self.status_name = status_name or status_str(self.status)
        self.message = message
        super().__init__(f"{self.status_name} (status {self.status}): {message}")


class SpattnNotSupportedError(SpattnError, NotImplementedError):
    """Valid input that this build cannot run (status 700 NOT_SUPPORTED, 501 BACKEND_UNAVAILABLE)."""


class SpattnTensor(ctypes.Structure):
    """Mirror of spattn_tensor (strides in elements)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class SpattnOptions(ctypes.Structure):
    """Mirror of spattn_options."""

    _fields_ = [
        ("backend", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("cuda_stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_size", ctypes.c_size_t),
        ("deterministic", ctypes.c_int32),
        ("reserved", ctypes.c_int32 * 7),
    ]


_PT = ctypes.POINTER(SpattnTensor)
_PO = ctypes.POINTER(SpattnOptions)
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lock = threading.Lock()


def _candidates() -> list:
    env = os.environ.get("SPATTN_LIBRARY")
    if env:
        return [env]
    here = Path(__file__).resolve().parent
    found = sorted(glob.glob(str(here / "lib" / "libspattn.so*")))
    # Running from a source checkout (PYTHONPATH=python): fall back to the repo's build folder.
    repo = here.parent.parent
    if (repo / "include" / "spattn.h").is_file():
        found += sorted(glob.glob(str(repo / "build" / "libspattn.so*")))
    return found


def library_path() -> str:
    """Path of the loaded libspattn (loads it on first use)."""
    lib()
    assert _lib_path is not None
    return _lib_path


def lib() -> ctypes.CDLL:
    """The loaded libspattn with argument types declared."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        cands = _candidates()
        if not cands:
            raise ImportError(
                "spattn: libspattn.so not found (not bundled in the package and SPATTN_LIBRARY unset); "
                "reinstall with `pip install ./python` or set SPATTN_LIBRARY=/path/to/libspattn.so")
        errors = []
        for path in cands:
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            _declare(handle)
            _lib, _lib_path = handle, path
            return handle
        raise ImportError("spattn: could not load libspattn: " + "; ".join(errors))


def _declare(h: ctypes.CDLL) -> None:
    i64, i32, dbl = ctypes.c_int64, ctypes.c_int32, ctypes.c_double
    h.spattn_status_str.argtypes = [ctypes.c_int]
    h.spattn_status_str.restype = ctypes.c_char_p
    h.spattn_last_error.argtypes = []
    h.spattn_last_error.restype = ctypes.c_char_p
    h.spattn_version.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    h.spattn_version.restype = ctypes.c_char_p
    h.spattn_options_init.argtypes = [_PO]
    h.spattn_options_init.restype = None
    h.spattn_cuda_available.argtypes = []
    h.spattn_cuda_available.restype = ctypes.c_int
    h.spattn_cpu_isa.argtypes = []
    h.spattn_cpu_isa.restype = ctypes.c_char_p
    h.spattn_bsa_fwd_ex.argtypes = [_PT, _PT, _PT, _PT, i64, i64, dbl, _PT, _PT, _PO]
    h.spattn_bsa_fwd_ex.restype = ctypes.c_int
    h.spattn_bsa_bwd_ex.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, _PT, i64, i64, dbl, _PT, _PT, _PT, _PO]
    h.spattn_bsa_bwd_ex.restype = ctypes.c_int
    h.spattn_sfa_fwd_ex.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, i64, i32, dbl, _PT, _PT, _PO]
    h.spattn_sfa_fwd_ex.restype = ctypes.c_int
    h.spattn_sfa_bwd_ex.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, i64, i32, dbl,
                                    _PT, _PT, _PT, _PT, _PT, _PO]
    h.spattn_sfa_bwd_ex.restype = ctypes.c_int
    psz = ctypes.POINTER(ctypes.c_size_t)
    h.spattn_bsa_workspace_size.argtypes = [_PT, _PT, _PT, _PT, i64, i64, i32, _PO, psz]
    h.spattn_bsa_workspace_size.restype = ctypes.c_int
    h.spattn_sfa_workspace_size.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, i64, i32, i32, _PO, psz]
    h.spattn_sfa_workspace_size.restype = ctypes.c_int


def status_str(status: int) -> str:
    """Short name of a status code (without loading the library if it is unavailable)."""
    try:
        raw = lib().spattn_status_str(int(status))
    except ImportError:
        return f"SPATTN_STATUS_{status}"
    return (raw or b"").decode("utf-8", "replace").split(":")[0]


def error(status: int, message: str) -> SpattnError:
    """The exception for a status (NotImplementedError flavour for 700 / 501)."""
    cls = SpattnNotSupportedError if status in (STATUS_NOT_SUPPORTED, STATUS_BACKEND_UNAVAILABLE) else SpattnError
    return cls(status, message)


def check(status: int) -> None:
    """Raise the mapped exception for a non-zero status, with spattn_last_error()'s text."""
    if status == STATUS_SUCCESS:
        return
    msg = (lib().spattn_last_error() or b"").decode("utf-8", "replace")
    raise error(status, msg)


def version() -> str:
    """Version string of the loaded library."""
    return lib().spattn_version(None, None, None).decode()


def cuda_available() -> bool:
    """True when the library was built with CUDA and a device is visible."""
    return bool(lib().spattn_cuda_available())


def cpu_isa() -> str:
    """SIMD variant of the CPU kernels on this machine."""
    return lib().spattn_cpu_isa().decode()


def make_tensor(name: str, ptr: int, dtype: int, shape: Sequence[int], strides: Sequence[int],
                device_type: int = DEVICE_CPU, device_id: int = 0) -> SpattnTensor:
    """A descriptor over memory at ``ptr`` (strides in elements)."""
    if not 1 <= len(shape) <= MAX_DIMS:
        raise SpattnError(STATUS_BAD_NDIM, f"{name}: ndim must be in [1, {MAX_DIMS}], got {len(shape)}",
                          "SPATTN_STATUS_BAD_NDIM")
    t = SpattnTensor()
    t.data = ptr or None
    t.device_type = device_type
    t.device_id = device_id
    t.dtype = dtype
    t.ndim = len(shape)
    for i, (s, st) in enumerate(zip(shape, strides)):
        t.shape[i] = int(s)
        t.strides[i] = int(st)
    return t


def int_arg(name: str, value, lo: int = INT64_MIN, hi: int = INT64_MAX,
            status: int = STATUS_INVALID_VALUE) -> int:
    """``value`` as a Python int that fits the C parameter (ctypes would silently wrap it).

    Integers only (int, NumPy / 0-d torch integers): 16.9 is an error, not 16.
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise SpattnError(status, f"{name}: expected an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise SpattnError(status, f"{name}: {v} does not fit the library's range [{lo}, {hi}]")
    return v


def block_size_pair(block_size) -> Tuple[int, int]:
    """(bx, by) from one integer or a pair of integers (checked by int_arg)."""
    if not isinstance(block_size, (tuple, list)) and hasattr(block_size, "__index__"):
        b = int_arg("block_size", block_size)
        return b, b
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 2:
        raise SpattnError(STATUS_INVALID_VALUE,
                          f"block_size: expected an integer or (bx, by), got {block_size!r}")
    return int_arg("block_size[0] (bx)", block_size[0]), int_arg("block_size[1] (by)", block_size[1])


def deterministic_arg(value, name: str = "deterministic") -> int:
    """spattn_options.deterministic (0 or 1) from a bool (or the integers 0 / 1, NumPy bools).

    Anything else is an error here (ctypes would wrap a large integer into the int32 field).
    """
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):  # Python or NumPy bool
        return int(bool(value))
    try:
        v = operator.index(value)
    except TypeError:
        raise SpattnError(STATUS_BAD_OPTIONS, f"{name}: expected a bool, got {value!r}",
                          "SPATTN_STATUS_BAD_OPTIONS") from None
    if v not in (0, 1):
        raise SpattnError(STATUS_BAD_OPTIONS, f"{name}: expected a bool (or 0 / 1), got {v}",
                          "SPATTN_STATUS_BAD_OPTIONS")
    return v


def options(cuda_stream: Optional[int] = None, num_threads: int = 0,
            deterministic=None) -> SpattnOptions:
    """spattn_options with defaults, optionally a CUDA stream handle, a CPU thread count and
    ``deterministic`` (None: the library default 1 = bitwise reproducible; True / False or 1 / 0;
    0 lets a backward use faster kernels whose summation order varies, CUDA only; only
    backward calls read it)."""
    opt = SpattnOptions()
    lib().spattn_options_init(ctypes.byref(opt))
    if cuda_stream:
        opt.cuda_stream = cuda_stream
    opt.num_threads = int_arg("num_threads", num_threads, INT32_MIN, INT32_MAX, STATUS_BAD_OPTIONS)
    if deterministic is not None:
        opt.deterministic = deterministic_arg(deterministic)
    return opt


def ref(t: Optional[SpattnTensor]):
    """Pointer argument for an optional descriptor (NULL for None)."""
    return ctypes.byref(t) if t is not None else None


def bsa_fwd(q, k, v, mask, bx: int, by: int, scale: float, o, lse, opt: SpattnOptions) -> None:
    bx, by = int_arg("bx", bx), int_arg("by", by)
    check(lib().spattn_bsa_fwd_ex(ref(q), ref(k), ref(v), ref(mask), bx, by, float(scale),
                                  ref(o), ref(lse), ctypes.byref(opt)))


def bsa_bwd(q, k, v, mask, bx: int, by: int, scale: float, o, dout, lse, dq, dk, dv,
            opt: SpattnOptions) -> None:
    bx, by = int_arg("bx", bx), int_arg("by", by)
    check(lib().spattn_bsa_bwd_ex(ref(q), ref(k), ref(v), ref(o), ref(dout), ref(lse), ref(mask), bx,
                                  by, float(scale), ref(dq), ref(dk), ref(dv), ctypes.byref(opt)))


def sfa_fwd(q, q_rope, k, k_rope, v, idx, sbs: int, mode: int, scale: float, o, lse,
            opt: SpattnOptions) -> None:
    sbs, mode = int_arg("sparse_block_size", sbs), int_arg("mode", mode, INT32_MIN, INT32_MAX)
    check(lib().spattn_sfa_fwd_ex(ref(q), ref(q_rope), ref(k), ref(k_rope), ref(v), ref(idx), sbs,
                                  mode, float(scale), ref(o), ref(lse), ctypes.byref(opt)))


def sfa_bwd(q, q_rope, k, k_rope, v, o, dout, lse, idx, sbs: int, mode: int, scale: float,
            dq, dq_rope, dk, dk_rope, dv, opt: SpattnOptions) -> None:
    sbs, mode = int_arg("sparse_block_size", sbs), int_arg("mode", mode, INT32_MIN, INT32_MAX)
    check(lib().spattn_sfa_bwd_ex(ref(q), ref(q_rope), ref(k), ref(k_rope), ref(v), ref(o), ref(dout),
                                  ref(lse), ref(idx), sbs, mode, float(scale), ref(dq),
                                  ref(dq_rope), ref(dk), ref(dk_rope), ref(dv), ctypes.byref(opt)))


def bsa_workspace_size(q, k, v, mask, bx: int, by: int, backward: bool, opt: SpattnOptions) -> int:
    """Bytes of caller workspace bsa_fwd (backward=False) / bsa_bwd needs with ``opt``."""
    bx, by = int_arg("bx", bx), int_arg("by", by)
    n = ctypes.c_size_t()
    check(lib().spattn_bsa_workspace_size(ref(q), ref(k), ref(v), ref(mask), bx, by, int(bool(backward)),
                                          ctypes.byref(opt), ctypes.byref(n)))
    return int(n.value)


def sfa_workspace_size(q, q_rope, k, k_rope, v, idx, sbs: int, mode: int, backward: bool,
                       opt: SpattnOptions) -> int:
    """Bytes of caller workspace sfa_fwd (backward=False) / sfa_bwd needs with ``opt``."""
    sbs, mode = int_arg("sparse_block_size", sbs), int_arg("mode", mode, INT32_MIN, INT32_MAX)
    n = ctypes.c_size_t()
    check(lib().spattn_sfa_workspace_size(ref(q), ref(q_rope), ref(k), ref(k_rope), ref(v), ref(idx),
                                          sbs, mode, int(bool(backward)), ctypes.byref(opt),
                                          ctypes.byref(n)))
    return int(n.value)


def scale_arg(scale: Optional[float]) -> float:
    """The library's scale argument: None means 0 (= the default 1/sqrt(D))."""
    if scale is None:
        return 0.0
    return float(scale)
