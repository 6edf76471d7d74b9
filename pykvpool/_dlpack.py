"""The static type of array arguments from other libraries in ``_native.pyi``."""

from __future__ import annotations

from typing import Any, Callable, Protocol

__all__ = ["DLPackArray"]


class DLPackArray(Protocol):
    """An array exporting DLPack (a CPU torch tensor): the native calls read it through a
    numpy view of its memory, without a copy, and refuse (``InvalidArgumentError``) another
    device, a tensor that requires grad, and one whose negative or conjugate bit is set."""

    @property
    def __dlpack__(self) -> Callable[..., Any]:
        """The exporter (``obj.__dlpack__(...)`` gives a DLPack capsule)."""

    def __dlpack_device__(self) -> Any:
        """``(device_type, device_id)``; 1 is the CPU."""
