"""Memory shared between the trusted harness and the subject, handed over as file descriptors.

The harness owns every buffer a call reads or writes (Q, K, V and the output O). It creates them,
passes their file descriptors to the subject process when it starts it, and reads O itself the
moment a call returns. File descriptors cross a sandbox's PID and IPC namespaces unchanged, which
CUDA's pid-based IPC handles do not.

- GPU: a CUDA virtual-memory allocation (cuMemCreate) exported as a POSIX file descriptor and
  mapped into each process with cuMemImportFromShareableHandle, through the driver API (ctypes on
  libcuda, which every CUDA machine has).
- CPU: a memfd, mapped with mmap.

Both sides wrap the mapping as a uint8 torch tensor. This module holds no policy; the subject uses
`map_buffer`, the harness `create_buffer`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os

import torch

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class CudaDriverError(RuntimeError):
    pass


_libcuda = None


def _driver():
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuMemAddressReserve.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                                 ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64]
        _libcuda.cuMemMap.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t,
                                      ctypes.c_uint64, ctypes.c_uint64]
        _libcuda.cuMemSetAccess.argtypes = [ctypes.c_uint64, ctypes.c_size_t,
                                            ctypes.POINTER(_AccessDesc), ctypes.c_size_t]
        _libcuda.cuMemCreate.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t,
                                         ctypes.POINTER(_AllocationProp), ctypes.c_uint64]
        _libcuda.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
                                                          ctypes.c_int, ctypes.c_uint64]
        _libcuda.cuMemImportFromShareableHandle.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                            ctypes.c_void_p, ctypes.c_int]
    return _libcuda


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        raise CudaDriverError(f"{what} failed: {name.value.decode() if name.value else result}")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(_CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


class _CudaArray:
    """A device pointer as torch.as_tensor takes it (the CUDA array interface); kept alive by the
    tensor made from it."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = dict(shape=(nbytes,), typestr="|u1", data=(ptr, False),
                                             version=3, strides=None)


@dataclasses.dataclass
class SharedBuffer:
    fd: int
    nbytes: int
    tensor: torch.Tensor     # uint8 of `nbytes` bytes

    def view(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float16) -> torch.Tensor:
        count = 1
        for n in shape:
            count *= n
        itemsize = torch.empty((), dtype=dtype).element_size()
        if count * itemsize > self.nbytes:
            raise ValueError(f"a {shape} {dtype} view needs {count * itemsize} bytes; the buffer "
                             f"has {self.nbytes}")
        return self.tensor[:count * itemsize].view(dtype).view(shape)


def _map_cuda(handle: int, nbytes: int, device: int) -> torch.Tensor:
    lib = _driver()
    ptr = ctypes.c_uint64()
    _check(lib.cuMemAddressReserve(ctypes.byref(ptr), nbytes, 0, 0, 0), "cuMemAddressReserve")
    _check(lib.cuMemMap(ptr.value, nbytes, 0, handle, 0), "cuMemMap")
    access = _AccessDesc(_Location(_CU_MEM_LOCATION_TYPE_DEVICE, device),
                         _CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    _check(lib.cuMemSetAccess(ptr.value, nbytes, ctypes.byref(access), 1), "cuMemSetAccess")
    return torch.as_tensor(_CudaArray(ptr.value, nbytes), device=f"cuda:{device}")


def _granularity(device: int) -> int:
    size = ctypes.c_size_t()
    prop = _prop(device)
    _check(_driver().cuMemGetAllocationGranularity(ctypes.byref(size), ctypes.byref(prop), 0),
           "cuMemGetAllocationGranularity")
    return size.value


def _current_device() -> int:
    """The device torch uses, with its primary context created (the driver calls need it)."""
    torch.empty(1, device="cuda")
    return torch.cuda.current_device()


def create_buffer(nbytes: int, device: str) -> SharedBuffer:
    """A new buffer of at least `nbytes` and its file descriptor (inheritable by a child)."""
    nbytes = max(int(nbytes), 1)
    if device == "cpu":
        fd = os.memfd_create("grader-buffer", 0)
        os.ftruncate(fd, nbytes)
        tensor = torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)
    else:
        index = _current_device()
        grain = _granularity(index)
        nbytes = -(-nbytes // grain) * grain
        handle = ctypes.c_uint64()
        prop = _prop(index)
        _check(_driver().cuMemCreate(ctypes.byref(handle), nbytes, ctypes.byref(prop), 0), "cuMemCreate")
        shared = ctypes.c_int()
        _check(_driver().cuMemExportToShareableHandle(ctypes.byref(shared), handle.value,
                                                      _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               "cuMemExportToShareableHandle")
        fd = shared.value
        tensor = _map_cuda(handle.value, nbytes, index)
    os.set_inheritable(fd, True)
    return SharedBuffer(fd, nbytes, tensor)


def map_buffer(fd: int, nbytes: int, device: str) -> SharedBuffer:
    """The subject's side: map a buffer the harness created, from its inherited descriptor."""
    if device == "cpu":
        return SharedBuffer(fd, nbytes, torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8))
    index = _current_device()
    handle = ctypes.c_uint64()
    _check(_driver().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd),
                                                    _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           "cuMemImportFromShareableHandle")
    return SharedBuffer(fd, nbytes, _map_cuda(handle.value, nbytes, index))
