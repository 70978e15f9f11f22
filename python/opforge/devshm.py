"""GPU memory shared between two processes through a POSIX file descriptor, for the judge and
its sandboxed child.

Why not legacy CUDA IPC: cudaIpcGetMemHandle handles do not open across PID namespaces, and the
judge runs each solution under bubblewrap with its own PID namespace. The CUDA driver's virtual
memory management API exports an allocation as a plain file descriptor instead, which crosses
namespaces like any fd (SCM_RIGHTS over a Unix socket, or inheritance):

    exporter: cuMemCreate(POSIX_FILE_DESCRIPTOR) -> cuMemExportToShareableHandle -> fd
    importer: cuMemImportFromShareableHandle(fd) -> handle
    both:     cuMemAddressReserve -> cuMemMap -> cuMemSetAccess(read/write on the device)

Everything goes through ctypes on libcuda.so.1 (the driver), loaded on first use, so this module
imports on a machine without a GPU; every entry point then raises DevShmUnavailable(reason).
OPFORGE_LIBCUDA names another library file (e.g. the toolkit's stub) for testing the bindings.

Mappings are made in the device's primary context, the one torch's runtime uses, so the
addresses are valid for torch kernels in this process.

Contracts left to the caller:
- Synchronisation across processes. Nothing here orders GPU work between the two processes: the
  writer finishes its writes (e.g. a torch copy, then torch.cuda.synchronize()) before it tells
  the other side over its own channel, and the reader synchronizes before it replies.
- Lifetime. A tensor view keeps its SharedDeviceBuffer object alive (so garbage collection never
  frees memory under a view), but close() unmaps immediately: never call it, or leave the `with`
  block, while views of the buffer are still in use. close() warns when views are still alive.

Self-check on a GPU machine: python -m opforge.devshm --selftest [--bwrap]
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from pathlib import Path

# --- cuda.h (CUDA 13) constants -------------------------------------------------------------

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
CU_MEM_LOCATION_TYPE_DEVICE = 0x1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0

_CUresult = ctypes.c_int          # enums are int-sized in the driver ABI
_CUdevice = ctypes.c_int
_CUdeviceptr = ctypes.c_ulonglong  # 64-bit build: typedef unsigned long long CUdeviceptr_v2
_CUhandle = ctypes.c_ulonglong     # CUmemGenericAllocationHandle
_CUcontext = ctypes.c_void_p


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CUmemAllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", CUmemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _CUmemAllocFlags)]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", ctypes.c_int)]


# A wrong layout would pass garbage to the driver silently: fail at import instead.
assert ctypes.sizeof(CUmemLocation) == 8
assert ctypes.sizeof(CUmemAllocationProp) == 32
assert CUmemAllocationProp.allocFlags.offset == 24
assert ctypes.sizeof(CUmemAccessDesc) == 12

_P = ctypes.POINTER
# Exported symbol names: cuda.h #defines cuDevicePrimaryCtxRelease, cuCtxPushCurrent and
# cuCtxPopCurrent to their _v2 forms; the VMM calls are unversioned in CUDA 13.
_SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (_P(ctypes.c_int),),
    "cuGetErrorName": (_CUresult, _P(ctypes.c_char_p)),
    "cuGetErrorString": (_CUresult, _P(ctypes.c_char_p)),
    "cuDeviceGetCount": (_P(ctypes.c_int),),
    "cuDeviceGet": (_P(_CUdevice), ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, _CUdevice),
    "cuDeviceGetAttribute": (_P(ctypes.c_int), ctypes.c_int, _CUdevice),
    "cuDevicePrimaryCtxRetain": (_P(_CUcontext), _CUdevice),
    "cuDevicePrimaryCtxRelease_v2": (_CUdevice,),
    "cuCtxPushCurrent_v2": (_CUcontext,),
    "cuCtxPopCurrent_v2": (_P(_CUcontext),),
    "cuCtxGetCurrent": (_P(_CUcontext),),
    "cuCtxSynchronize": (),
    "cuMemGetAllocationGranularity": (_P(ctypes.c_size_t), _P(CUmemAllocationProp), ctypes.c_int),
    "cuMemCreate": (_P(_CUhandle), ctypes.c_size_t, _P(CUmemAllocationProp), ctypes.c_ulonglong),
    "cuMemRelease": (_CUhandle,),
    "cuMemAddressReserve": (_P(_CUdeviceptr), ctypes.c_size_t, ctypes.c_size_t, _CUdeviceptr,
                            ctypes.c_ulonglong),
    "cuMemAddressFree": (_CUdeviceptr, ctypes.c_size_t),
    "cuMemMap": (_CUdeviceptr, ctypes.c_size_t, ctypes.c_size_t, _CUhandle, ctypes.c_ulonglong),
    "cuMemUnmap": (_CUdeviceptr, ctypes.c_size_t),
    "cuMemSetAccess": (_CUdeviceptr, ctypes.c_size_t, _P(CUmemAccessDesc), ctypes.c_size_t),
    # shareableHandle points at an int for POSIX fds; osHandle *is* the fd, cast to void*.
    "cuMemExportToShareableHandle": (ctypes.c_void_p, _CUhandle, ctypes.c_int, ctypes.c_ulonglong),
    "cuMemImportFromShareableHandle": (_P(_CUhandle), ctypes.c_void_p, ctypes.c_int),
}


class DevShmUnavailable(RuntimeError):
    """No driver, no device, or a device without fd-shareable VMM memory; `reason` says which."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class CudaDriverError(RuntimeError):
    """A driver call failed on a machine where shared device memory is otherwise available."""

    def __init__(self, call, code, text):
        super().__init__(f"{call} failed: {text}")
        self.call, self.code = call, code


# --- the driver -----------------------------------------------------------------------------

# For when cuGetErrorName itself fails (the stub library, a broken install).
_FALLBACK_NAMES = {3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
                   34: "CUDA_ERROR_STUB_LIBRARY", 35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
                   100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
                   800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED",
                   803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
                   804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"}


class _Driver:
    def __init__(self, lib):
        self.lib = lib
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise DevShmUnavailable(f"the CUDA driver has no {name} (driver too old)") from None
            fn.argtypes, fn.restype = list(argtypes), _CUresult

    def error_text(self, code):
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        # The lookups can fail themselves (e.g. the stub library): fall back to the number.
        if self.lib.cuGetErrorName(code, ctypes.byref(name)) != CUDA_SUCCESS or not name.value:
            return f"{_FALLBACK_NAMES.get(code, 'CUresult')} ({code})"
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        detail = f": {text.value.decode()}" if text.value else ""
        return f"{name.value.decode()} ({code}){detail}"

    def call(self, name, *args):
        code = getattr(self.lib, name)(*args)
        if code != CUDA_SUCCESS:
            raise CudaDriverError(name, code, self.error_text(code))

    def out(self, name, ctype, *args):
        """Call `name(&result, *args)` and return result.value."""
        result = ctype()
        self.call(name, ctypes.byref(result), *args)
        return result.value


_lock = threading.Lock()
_drv = None


def _driver():
    global _drv
    with _lock:
        if _drv is None:
            _drv = _load_driver()
        return _drv


def _load_driver():
    path = os.environ.get("OPFORGE_LIBCUDA") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise DevShmUnavailable(f"cannot load the CUDA driver {path}: {e}") from None
    drv = _Driver(lib)
    try:
        drv.call("cuInit", 0)
    except CudaDriverError as e:
        raise DevShmUnavailable(str(e)) from None
    return drv


def _device(drv, index):
    """The CUdevice for `index`, after checking it can export VMM memory as a POSIX fd."""
    count = drv.out("cuDeviceGetCount", ctypes.c_int)
    if not 0 <= index < count:
        raise DevShmUnavailable(f"no CUDA device {index} ({count} visible)")
    dev = drv.out("cuDeviceGet", _CUdevice, index)
    for attr, what in ((CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                        "virtual memory management"),
                       (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                        "POSIX file-descriptor memory handles")):
        try:
            supported = drv.out("cuDeviceGetAttribute", ctypes.c_int, attr, dev)
        except CudaDriverError as e:  # an old driver that does not know the attribute
            raise DevShmUnavailable(f"cannot ask CUDA device {index} about {what}: {e}") from None
        if not supported:
            raise DevShmUnavailable(f"CUDA device {index} does not support {what}")
    return dev


def _align_torch(index):
    """Initialise torch's CUDA state so it and this module agree on device numbering; without
    torch the raw pointer API still works."""
    try:
        import torch
    except ImportError:
        return
    try:
        torch.cuda.init()
        count = torch.cuda.device_count()
    except Exception as e:  # torch raises plain RuntimeErrors/AssertionErrors here
        raise DevShmUnavailable(f"torch cannot initialise CUDA: {e}") from None
    if index >= count:
        raise DevShmUnavailable(f"torch sees {count} CUDA devices, not device {index}")


def device_name(index=0):
    drv = _driver()
    buf = ctypes.create_string_buffer(256)
    drv.call("cuDeviceGetName", buf, len(buf), drv.out("cuDeviceGet", _CUdevice, index))
    return buf.value.decode()


def driver_version():
    return _driver().out("cuDriverGetVersion", ctypes.c_int)


def _alloc_prop(index):
    prop = CUmemAllocationProp()  # zeroed: win32HandleMetaData and allocFlags must be 0
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, index)
    return prop


def _round_up(n, unit):
    return -(-n // unit) * unit


def _timed(timings, key, fn):
    t0 = time.perf_counter()
    result = fn()
    timings[key] = round((time.perf_counter() - t0) * 1e3, 3)
    return result


# --- tensor views ---------------------------------------------------------------------------

class _CudaArray:
    """__cuda_array_interface__ v3 over part of a buffer. torch keeps this object referenced
    for as long as the tensor's storage lives, and this object holds the buffer."""

    def __init__(self, owner, ptr, shape, typestr):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "version": 3, "shape": shape, "typestr": typestr, "data": (ptr, False),
            "strides": None,  # C-contiguous
            "stream": None,  # no implicit synchronisation: ordering is the caller's job
        }


# typestrs torch reads natively through numpy; the rest go through a same-size integer.
_NATIVE = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "int8": "|i1",
           "int16": "<i2", "int32": "<i4", "int64": "<i8", "uint8": "|u1"}
_BY_SIZE = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}


def _raw_layout(dtype, shape):
    """(typestr, raw shape, needs .view(dtype)) for a view of `dtype` with `shape`."""
    name = str(dtype).removeprefix("torch.")
    if name in _NATIVE:
        return _NATIVE[name], shape, False
    size = dtype.itemsize
    if size in _BY_SIZE:
        return _BY_SIZE[size], shape, True
    if size % 8:
        raise TypeError(f"cannot view shared memory as {dtype} ({size} bytes per element)")
    # complex128 and friends: several int64 in the last dimension, folded back by .view(dtype)
    k = size // 8
    raw = (shape[:-1] + (shape[-1] * k,)) if shape else (k,)
    return "<i8", raw, True


# --- the buffer -----------------------------------------------------------------------------

class SharedDeviceBuffer:
    """Device memory mapped in this process and shareable by fd; see the module docstring.

    create(nbytes, device_index) allocates and exports (buf.fd is the exported fd, owned by buf,
    close-on-exec unless inheritable=True); open(fd, nbytes, device_index) imports in another
    process. nbytes is rounded up to the allocation granularity (2 MiB on current GPUs); the
    importer must pass the exporter's buf.nbytes (or a smaller size that rounds to it)."""

    def __init__(self, drv, dev, device_index):
        # Everything close() looks at exists before the first driver call can fail.
        self._drv, self._dev, self.device_index = drv, dev, device_index
        self.nbytes, self.granularity = 0, 0
        self._ctx = None
        self._handle = None
        self._ptr = 0
        self._mapped = False
        self._fd, self._owns_fd = None, False
        self._closed = False
        self._views = weakref.WeakSet()
        self.timings_ms = {}
        self._ctx = _CUcontext(drv.out("cuDevicePrimaryCtxRetain", _CUcontext, dev))

    @classmethod
    def _new(cls, nbytes, device_index):
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, not {nbytes}")
        drv = _driver()
        dev = _device(drv, device_index)
        _align_torch(device_index)
        buf = cls(drv, dev, device_index)
        try:
            with buf._current():  # some driver calls want a current context: give them ours
                buf.granularity = drv.out(
                    "cuMemGetAllocationGranularity", ctypes.c_size_t,
                    ctypes.byref(_alloc_prop(device_index)), CU_MEM_ALLOC_GRANULARITY_MINIMUM)
            buf.nbytes = _round_up(nbytes, buf.granularity)
        except BaseException:
            buf.close()
            raise
        return buf

    @classmethod
    def create(cls, nbytes, device_index=0, *, inheritable=False):
        buf = cls._new(nbytes, device_index)
        try:
            with buf._current():
                buf._handle = _timed(buf.timings_ms, "create", buf._mem_create)
                buf._fd = _timed(buf.timings_ms, "export", buf._export)
                buf._owns_fd = True
                os.set_inheritable(buf._fd, inheritable)
                _timed(buf.timings_ms, "map", buf._map)
        except BaseException:
            buf.close()
            raise
        return buf

    @classmethod
    def open(cls, fd, nbytes, device_index=0, *, close_fd=False):
        """Import `fd` (from create() in another process). The fd stays the caller's unless
        close_fd=True, in which case it is closed once imported (or on failure): the imported
        handle keeps the memory alive without it."""
        try:
            buf = cls._new(nbytes, device_index)
            try:
                with buf._current():
                    buf._handle = _timed(buf.timings_ms, "import", lambda: buf._import(fd))
                    _timed(buf.timings_ms, "map", buf._map)
            except BaseException:
                buf.close()
                raise
        finally:
            if close_fd:
                os.close(fd)
        buf._fd = None if close_fd else fd
        return buf

    # driver steps, run inside _current()
    def _mem_create(self):
        prop = _alloc_prop(self.device_index)
        return self._drv.out("cuMemCreate", _CUhandle, self.nbytes, ctypes.byref(prop), 0)

    def _export(self):
        fd = ctypes.c_int(-1)
        self._drv.call("cuMemExportToShareableHandle", ctypes.byref(fd), self._handle,
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        return fd.value

    def _import(self, fd):
        return self._drv.out("cuMemImportFromShareableHandle", _CUhandle, ctypes.c_void_p(fd),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)

    def _map(self):
        drv, size = self._drv, self.nbytes
        self._ptr = drv.out("cuMemAddressReserve", _CUdeviceptr, size, self.granularity, 0, 0)
        drv.call("cuMemMap", self._ptr, size, 0, self._handle, 0)
        self._mapped = True
        access = CUmemAccessDesc(CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, self.device_index),
                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        drv.call("cuMemSetAccess", self._ptr, size, ctypes.byref(access), 1)

    @contextlib.contextmanager
    def _current(self):
        """Make the primary context current on this thread for the duration, then restore."""
        self._drv.call("cuCtxPushCurrent_v2", self._ctx)
        try:
            yield
        finally:
            self._drv.call("cuCtxPopCurrent_v2", ctypes.byref(_CUcontext()))

    # public surface
    @property
    def fd(self):
        """The exported fd (create) or the caller's fd (open without close_fd); else None."""
        return self._fd

    @property
    def ptr(self):
        self._check_open()
        return self._ptr

    @property
    def closed(self):
        return self._closed

    @property
    def live_views(self):
        """How many tensor views of this buffer are still alive (as far as GC has noticed)."""
        return len(self._views)

    @property
    def primary_context(self):
        return self._ctx.value

    def set_inheritable(self, inheritable=True):
        """Clear (or set) close-on-exec on the exported fd, for a child that inherits it."""
        if self._fd is None:
            raise ValueError("this buffer holds no fd")
        os.set_inheritable(self._fd, inheritable)

    def tensor(self, offset, shape, dtype):
        """A zero-copy torch.Tensor of `shape`/`dtype` at byte `offset`, on cuda:<device_index>.
        It keeps this object alive, but close() still unmaps under it: see the module docstring."""
        import torch
        self._check_open()
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
        self._check_region(offset, shape, dtype)
        device = torch.device("cuda", self.device_index)
        if math.prod(shape) == 0:
            return torch.empty(shape, dtype=dtype, device=device)  # no bytes to share
        typestr, raw_shape, reinterpret = _raw_layout(dtype, shape)
        iface = _CudaArray(self, self._ptr + offset, raw_shape, typestr)
        self._views.add(iface)
        # as_tensor moves anything not on the *current* device, so make ours current.
        with torch.cuda.device(device):
            t = torch.as_tensor(iface, device=device)
        if reinterpret:
            t = t.view(dtype).reshape(shape)
        if t.device != device or t.data_ptr() != self._ptr + offset:
            raise RuntimeError(f"torch copied the shared memory view ({t.device}); not zero-copy")
        return t

    def _check_region(self, offset, shape, dtype):
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in {shape}")
        size = math.prod(shape) * dtype.itemsize
        if offset < 0 or offset % dtype.itemsize or offset + size > self.nbytes:
            raise ValueError(f"region [{offset}, {offset + size}) of {dtype} is misaligned or "
                             f"outside the {self.nbytes}-byte buffer")

    def _check_open(self):
        if self._closed:
            raise ValueError("SharedDeviceBuffer is closed")

    def close(self):
        """Unmap and release; idempotent. Waits for the device first, so kernels still in flight
        never touch an unmapped range. Every step runs; the first failure is raised at the end."""
        if self._closed:
            return
        self._closed = True
        if self._views:
            warnings.warn(f"closing a SharedDeviceBuffer with {len(self._views)} live tensor "
                          f"view(s); they now point at unmapped memory", RuntimeWarning, 2)
        errors = []
        if self._ctx is not None:
            self._release_cuda(errors)
        if self._owns_fd:
            self._attempt(errors, os.close, self._fd)
            self._fd = None
        if errors:
            raise errors[0]

    def _release_cuda(self, errors):
        drv, ctx, self._ctx = self._drv, self._ctx, None
        if self._attempt(errors, drv.call, "cuCtxPushCurrent_v2", ctx):
            if self._mapped:
                self._attempt(errors, drv.call, "cuCtxSynchronize")
                self._attempt(errors, drv.call, "cuMemUnmap", self._ptr, self.nbytes)
            if self._ptr:
                self._attempt(errors, drv.call, "cuMemAddressFree", self._ptr, self.nbytes)
            if self._handle is not None:
                self._attempt(errors, drv.call, "cuMemRelease", self._handle)
            self._attempt(errors, drv.call, "cuCtxPopCurrent_v2", ctypes.byref(_CUcontext()))
        self._attempt(errors, drv.call, "cuDevicePrimaryCtxRelease_v2", self._dev)
        self._mapped, self._ptr, self._handle = False, 0, None

    @staticmethod
    def _attempt(errors, fn, *args):
        try:
            fn(*args)
            return True
        except Exception as e:
            errors.append(e)
            return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass  # interpreter shutdown or a dead context: nothing useful left to do

    def __repr__(self):
        state = "closed" if self._closed else f"ptr=0x{self._ptr:x}"
        return (f"SharedDeviceBuffer(cuda:{self.device_index}, nbytes={self.nbytes}, "
                f"fd={self._fd}, {state})")


# --- self-check -----------------------------------------------------------------------------

_XOR = 0x5A5A5A5A
_BWRAP = ["bwrap", "--ro-bind", "/", "/",  # first: later mounts must sit on top of it
          "--dev-bind", "/dev", "/dev",  # --ro-bind mounts nodev; the driver needs /dev/nvidia*
          "--proc", "/proc",  # a procfs of the new PID namespace
          "--tmpfs", "/tmp",  # importing torch needs a writable temporary directory
          "--unshare-pid", "--unshare-ipc", "--unshare-net", "--die-with-parent"]


def _layout(buf):
    """Three page-aligned regions: input (parent writes), output (child writes), scratch."""
    region = buf.nbytes // 3 // 4096 * 4096
    return {"region": region, "in": 0, "out": region, "scratch": 2 * region}


def _pattern(n, device):
    import torch
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * 2654435761 + 12345) % 2**31).to(torch.int32)


def _random(shape, dtype, device):
    import torch
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.randint(0, 100, shape, dtype=dtype, device=device)


def _view_dtypes():
    import torch
    names = ["bfloat16", "float16", "float32", "bool", "complex64", "complex128", "int64",
             "float8_e4m3fn"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def _check_views(buf, offset):
    """Each dtype (native or reinterpreted) and shape writes through the view and reads back
    byte for byte through a uint8 view of the same memory."""
    import torch
    device = torch.device("cuda", buf.device_index)
    checked = []
    for dtype in _view_dtypes():
        for shape in ((), (7,), (3, 5)):
            t = buf.tensor(offset, shape, dtype)
            src = _random(shape, dtype, device)
            t.copy_(src)
            raw = buf.tensor(offset, (src.numel() * dtype.itemsize,), torch.uint8)
            if not torch.equal(raw, src.reshape(-1).view(torch.uint8)):
                raise RuntimeError(f"{dtype} view of shape {shape} does not alias the memory")
        checked.append(str(dtype).removeprefix("torch."))
    return checked


def _context_matches(buf):
    """True when torch's current context on this device is the primary context we mapped in."""
    import torch
    with torch.cuda.device(buf.device_index):
        torch.cuda.synchronize()
        current = buf._drv.out("cuCtxGetCurrent", _CUcontext)
    return current == buf.primary_context


def _pidns():
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _child_main(sock_fd):
    """Child side: receive the fd, check the input pattern, write the output, reply."""
    sock = socket.socket(fileno=sock_fd)
    reply = {"ok": False, "pid": os.getpid(), "pidns": _pidns()}
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 65536, 1)
        if len(fds) != 1:
            raise RuntimeError(f"expected one fd with the message, got {len(fds)}")
        reply.update(_child_work(json.loads(msg), fds[0]))
        reply["ok"] = True
    except Exception as e:
        reply["reason"] = f"{type(e).__name__}: {e}"
    sock.sendall(json.dumps(reply).encode())
    sock.close()
    return 0 if reply["ok"] else 1


def _child_work(info, fd):
    import torch
    out = {}
    with SharedDeviceBuffer.open(fd, info["nbytes"], info["device"], close_fd=True) as buf:
        lay = _layout(buf)
        n = lay["region"] // 4
        got = buf.tensor(lay["in"], (n,), torch.int32)
        if not torch.equal(got, _pattern(n, got.device)):
            raise RuntimeError("the input pattern written by the parent is not there")
        buf.tensor(lay["out"], (n,), torch.int32).copy_(got ^ _XOR)
        out["views"] = _check_views(buf, lay["scratch"])
        out["torch_ctx_is_primary"] = _context_matches(buf)
        torch.cuda.synchronize(buf.device_index)  # the parent reads only after this reply
        out["timings_ms"] = dict(buf.timings_ms)
        del got
    return out


def _spawn_child(child_sock, use_bwrap, stderr_file):
    cmd = [sys.executable, "-m", "opforge.devshm", "--child", str(child_sock.fileno())]
    if use_bwrap:
        if shutil.which("bwrap") is None:
            raise RuntimeError("--bwrap: bwrap is not on PATH")
        cmd = _BWRAP + ["--"] + cmd  # bwrap passes inherited fds through to the sandbox
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, pass_fds=(child_sock.fileno(),), env=env,
                            stdin=subprocess.DEVNULL, stdout=stderr_file, stderr=stderr_file)
    return proc, cmd


def _ask_child(sock, buf, timeout):
    """Send the fd and sizes, wait for the single reply packet; None if the child died."""
    info = {"nbytes": buf.nbytes, "device": buf.device_index}
    socket.send_fds(sock, [json.dumps(info).encode()], [buf.fd])
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except socket.timeout:
        raise RuntimeError(f"the child did not reply within {timeout} s") from None
    return json.loads(data) if data else None


def _child_failure(proc, stderr_file, what):
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = "still running"
    stderr_file.seek(0)
    tail = stderr_file.read().decode(errors="replace")[-2000:].strip()
    return RuntimeError(f"{what} (child rc={rc}); child output: {tail or '(none)'}")


def _run_child(buf, args, report):
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with parent_sock, tempfile.TemporaryFile() as stderr_file:
        t0 = time.perf_counter()
        with child_sock:
            proc, cmd = _spawn_child(child_sock, args.bwrap, stderr_file)
        report["child_cmd"] = cmd
        try:
            reply = _ask_child(parent_sock, buf, args.timeout)
            report["child_roundtrip_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            if reply is None:
                raise _child_failure(proc, stderr_file, "the child exited without replying")
            if not reply.get("ok"):
                raise _child_failure(proc, stderr_file, f"child: {reply.get('reason')}")
            proc.wait(timeout=30)
            return reply
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _run_parent(args, report):
    import torch
    buf = SharedDeviceBuffer.create(args.nbytes, args.device)
    with buf:
        report.update(device=device_name(args.device), driver_version=driver_version(),
                      torch=torch.__version__, nbytes=buf.nbytes, granularity=buf.granularity,
                      fd=buf.fd)
        lay = _layout(buf)
        n = lay["region"] // 4
        report["parent_views"] = _check_views(buf, lay["scratch"])
        inp = buf.tensor(lay["in"], (n,), torch.int32)
        inp.copy_(_pattern(n, inp.device))
        buf.tensor(lay["out"], (n,), torch.int32).zero_()  # a stale result cannot pass
        report["parent_torch_ctx_is_primary"] = _context_matches(buf)  # synchronizes too
        reply = _run_child(buf, args, report)
        out = buf.tensor(lay["out"], (n,), torch.int32)
        if not torch.equal(out, _pattern(n, out.device) ^ _XOR):
            raise RuntimeError("the child's result is not in the shared memory")
        report["timings_ms"] = {"parent": dict(buf.timings_ms), "child": reply["timings_ms"]}
        report.update(child_pid=reply["pid"], child_pidns=reply["pidns"],
                      child_views=reply["views"],
                      child_torch_ctx_is_primary=reply["torch_ctx_is_primary"])
        del inp, out
    _check_namespaces(args, report)


def _check_namespaces(args, report):
    report["parent_pidns"] = _pidns()
    report["separate_pidns"] = report["child_pidns"] != report["parent_pidns"]
    if args.bwrap and not report["separate_pidns"]:
        raise RuntimeError("--bwrap: the child ran in the parent's PID namespace")


def selftest(args):
    """Print one JSON line; exit status 0 ok, 2 unavailable here, 1 failed."""
    report = {"ok": False, "mode": "bwrap" if args.bwrap else "plain"}
    rc = 1
    try:
        _run_parent(args, report)
        report["ok"], rc = True, 0
    except DevShmUnavailable as e:
        report["reason"], rc = f"unavailable: {e.reason}", 2
    except Exception as e:
        report["reason"] = f"{type(e).__name__}: {e}"
    print(json.dumps(report), flush=True)
    return rc


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m opforge.devshm",
        description="GPU memory shared across processes by POSIX fd (CUDA VMM). --selftest "
                    "prints one JSON line; exit 0 ok, 1 failed, 2 unavailable on this machine.")
    parser.add_argument("--selftest", action="store_true",
                        help="share a buffer with a child process and check both directions")
    parser.add_argument("--bwrap", action="store_true",
                        help="run the child under bubblewrap in new PID/IPC/net namespaces")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument("--nbytes", type=int, default=3 << 20,
                        help="buffer size before rounding to the granularity (default 3 MiB)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for the child's reply (default 120)")
    parser.add_argument("--child", type=int, metavar="SOCKFD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child_main(args.child)
    if not args.selftest:
        parser.print_help()
        return 2
    return selftest(args)


if __name__ == "__main__":
    sys.exit(main())
