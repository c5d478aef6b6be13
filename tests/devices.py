"""Devices described for tests that grade, build or schedule without one: a CPU machine, and a
GPU's description (no GPU behind it)."""

from __future__ import annotations

from grader.isolation.device import DeviceInfo

CPU = DeviceInfo(cuda=False, name="cpu", capability=None, arch="90a", l2_bytes=0, memory_bytes=0,
                 sm_count=0, driver="none", torch_version="x", cuda_version=None, nvcc=None,
                 python="3")
GPU = DeviceInfo(cuda=True, name="gpu", capability=(9, 0), arch="90a", l2_bytes=0,
                 memory_bytes=0, sm_count=0, driver="x", torch_version="x", cuda_version="x",
                 nvcc=None, python="3")
