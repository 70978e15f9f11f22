"""The wire between the judge and a solution's child process: messages on a Unix socket and
tensors in shared memory.

Nothing but plain data crosses it. Messages are JSON objects on an AF_UNIX SOCK_SEQPACKET socket
(one message per packet, file descriptors alongside with SCM_RIGHTS). Tensors live in *arenas*:
a memfd on the host (CPU tasks) or a CUDA allocation exported as a POSIX file descriptor
(python/opforge/devshm.py, GPU tasks), mapped by both processes. A tensor on the wire is a spec
{"offset", "shape", "dtype"} into an arena: contiguous, of a dtype from a fixed list, inside the
arena's bounds. So whatever the child returns is bytes the judge reads itself: no tensor
subclass, overridden __eq__ or lazy object survives the crossing (docs/architecture.md, "The
judge").
"""
import array
import json
import mmap
import os
import socket
import time

import torch

MAX_MESSAGE = 1 << 20
ALIGN = 256

# dtypes that may cross; anything else is refused with a clear message.
DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128")}


class WireError(Exception):
    """The peer broke the protocol (bad message, bad spec, closed socket, timeout)."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


def dtype_name(dtype):
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise WireError("unsupported_dtype", f"tensors of dtype {name} cannot be exchanged (supported: "
                                             f"{', '.join(DTYPES)})")
    return name


# ---------------------------------------------------------------------------------------------
# Messages


MAX_FDS = 16
_FD_ARRAY = array.array("i")


def _recv_fds(sock, flags=0):
    """(data, fds, msg_flags): one message and the descriptors passed with it. Not
    socket.recv_fds, which drops its flags argument (CPython gh-107898, 3.11 and 3.12 alike), so a
    MSG_DONTWAIT poll through it blocks."""
    data, ancdata, msg_flags, _ = sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_LEN(MAX_FDS * _FD_ARRAY.itemsize),
                                               flags)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), msg_flags


def _not_json(word):
    # Python's json reads NaN and Infinity, which are not JSON: from the peer they would reach the
    # judge's statistics and then its report, which nothing downstream can parse.
    raise ValueError(f"{word} is not JSON")


def _finite_float(text):
    # 1e999 is valid JSON that Python reads as inf: the same NaN/Infinity hole by another spelling.
    x = float(text)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is not a finite number")
    return x


MAX_INT = 1 << 63


def _bounded_int(text):
    # Nothing on the wire is a count past 2^63; a 400-digit integer would overflow float() in the
    # judge's statistics (an exception there reads as the judge's failure, not the solution's).
    x = int(text)
    if abs(x) >= MAX_INT:
        raise ValueError(f"integer of {len(text)} digits is out of range")
    return x


class Channel:
    """One end of a SOCK_SEQPACKET socketpair. send/recv are blocking with a timeout; a closed
    peer or a timeout is a WireError, never a hang."""

    def __init__(self, sock):
        self.sock = sock

    @classmethod
    def pair(cls):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE * 2)
        return cls(a), b

    @classmethod
    def from_fd(cls, fd):
        return cls(socket.socket(fileno=fd))

    def send(self, msg, fds=()):
        data = json.dumps(msg).encode()
        if len(data) > MAX_MESSAGE:
            raise WireError("protocol_error", f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)
        except OSError as e:
            raise WireError("peer_gone", f"cannot send to the peer: {e}") from None

    def recv(self, timeout=None, spin_s=0.0):
        """(message dict, [fds]). Raises WireError on timeout, EOF or garbage.

        spin_s > 0 polls without sleeping for up to that long before blocking: waking a process
        that sleeps in recv costs tens of microseconds, which a timed GPU call would carry twice."""
        got = self._spin(spin_s) if spin_s > 0 else None
        if got is None:
            left = None if timeout is None else max(timeout - spin_s, 0.001)
            self.sock.settimeout(left)
            try:
                got = _recv_fds(self.sock)
            except socket.timeout:
                raise WireError("timeout", f"no answer within {timeout:.1f} s") from None
            except OSError as e:
                raise WireError("peer_gone", f"the peer's socket failed: {e}") from None
            finally:
                self.sock.settimeout(None)
        return self._parse(*got[:3])

    def _spin(self, spin_s):
        end = time.perf_counter() + spin_s
        while True:
            try:
                return _recv_fds(self.sock, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                if time.perf_counter() > end:
                    return None
            except OSError as e:
                raise WireError("peer_gone", f"the peer's socket failed: {e}") from None

    @staticmethod
    def _parse(data, fds, flags):
        if not data:
            for fd in fds:
                os.close(fd)
            raise WireError("peer_gone", "the peer closed its socket")
        if len(data) > MAX_MESSAGE or flags & socket.MSG_TRUNC:
            raise WireError("protocol_error", "oversized message")
        try:
            msg = json.loads(data, parse_constant=_not_json, parse_float=_finite_float, parse_int=_bounded_int)
        except ValueError:
            raise WireError("protocol_error", f"not JSON: {data[:80]!r}") from None
        if not isinstance(msg, dict):
            raise WireError("protocol_error", "a message must be a JSON object")
        return msg, list(fds)

    def pending(self):
        """True when the peer sent something not asked for (checked before each request)."""
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# Arenas


def _round(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


class HostArena:
    """A memfd mapped shared: CPU tensors are zero-copy views of it in both processes."""

    def __init__(self, fd, nbytes):
        self.fd, self.nbytes = fd, nbytes
        self.map = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.device = "cpu"

    @classmethod
    def create(cls, nbytes, name="opforge-arena"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, max(nbytes, 1))
        return cls(fd, nbytes)

    def tensor(self, spec):
        offset, shape, dtype = check_spec(spec, self.nbytes)
        count = _numel(shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self.map, dtype=dtype, count=count, offset=offset)
        return flat.view(shape)

    def close(self):
        try:
            self.map.close()
        except BufferError:
            pass  # views still alive: the mapping goes with them
        os.close(self.fd)


class DeviceArena:
    """GPU memory shared through a POSIX file descriptor (python/opforge/devshm.py): legacy CUDA IPC
    handles do not open across the sandbox's PID namespace, these do."""

    def __init__(self, buf):
        self.buf, self.fd, self.nbytes = buf, buf.fd, buf.nbytes
        self.device = f"cuda:{buf.device_index}"

    @staticmethod
    def _index(device):
        d = torch.device(device)
        return d.index if d.index is not None else torch.cuda.current_device()

    @classmethod
    def create(cls, nbytes, device):
        from opforge import devshm

        return cls(devshm.SharedDeviceBuffer.create(max(nbytes, 1), cls._index(device)))

    @classmethod
    def open(cls, fd, nbytes, device):
        from opforge import devshm

        return cls(devshm.SharedDeviceBuffer.open(fd, nbytes, cls._index(device), close_fd=True))

    def tensor(self, spec):
        offset, shape, dtype = check_spec(spec, self.nbytes)
        return self.buf.tensor(offset, shape, dtype)

    def close(self):
        self.buf.close()


def open_arena(kind, fd, nbytes, device):
    if kind == "host":
        return HostArena(fd, nbytes)
    return DeviceArena.open(fd, nbytes, device)


def create_arena(nbytes, device):
    if str(device).startswith("cuda"):
        return DeviceArena.create(nbytes, device)
    return HostArena.create(nbytes)


def arena_kind(arena):
    return "host" if isinstance(arena, HostArena) else "device"


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def check_spec(spec, limit):
    """(offset, shape, dtype) of a spec, or WireError when it is malformed or out of bounds."""
    try:
        offset, shape, dtype = int(spec["offset"]), [int(s) for s in spec["shape"]], DTYPES[spec["dtype"]]
    except (KeyError, TypeError, ValueError):
        raise WireError("protocol_error", f"bad tensor spec {str(spec)[:120]}") from None
    size = _numel(shape) * torch.empty((), dtype=dtype).element_size()
    if offset < 0 or any(s < 0 for s in shape) or offset % ALIGN or offset + size > limit:
        raise WireError("protocol_error", f"tensor spec {spec} is outside its arena of {limit} bytes")
    return offset, shape, dtype


def layout(tensors):
    """Specs placing each tensor (its shape and dtype) in one arena; returns (specs, nbytes)."""
    specs, off = [], 0
    for t in tensors:
        size = t.numel() * t.element_size()
        specs.append({"offset": off, "shape": list(t.shape), "dtype": dtype_name(t.dtype)})
        off += _round(size)
    return specs, off


# ---------------------------------------------------------------------------------------------
# Values: plain JSON, tensors by reference to a spec list


def encode(value, tensors):
    """JSON for a Python value; tensor leaves are appended to `tensors` and encoded by index."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"tensor": len(tensors) - 1}
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [encode(v, tensors) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v, tensors) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    raise WireError("unsupported_value", f"a {type(value).__name__} cannot cross to the solution's process")


def decode(obj, tensors):
    if isinstance(obj, dict):
        if "tensor" in obj:
            return tensors[int(obj["tensor"])]
        if "list" in obj:
            return [decode(v, tensors) for v in obj["list"]]
        if "tuple" in obj:
            return tuple(decode(v, tensors) for v in obj["tuple"])
        if "dict" in obj:
            return {k: decode(v, tensors) for k, v in obj["dict"].items()}
        if "dtype" in obj:
            return DTYPES[obj["dtype"]]
        raise WireError("protocol_error", f"unknown value tag in {str(obj)[:80]}")
    return obj


def pack(values, device):
    """An arena holding `values`' tensors (copied, contiguous), and the JSON describing them.
    Returns (arena or None, encoded, specs)."""
    tensors = []
    encoded = encode(values, tensors)
    if not tensors:
        return None, encoded, []
    specs, nbytes = layout(tensors)
    arena = create_arena(nbytes, device)
    for t, s in zip(tensors, specs):
        arena.tensor(s).copy_(t.detach().reshape(s["shape"]))
    return arena, encoded, specs


def fd_list(*arenas):
    return [a.fd for a in arenas if a is not None]

