"""The static type of array arguments from other libraries in ``_native.pyi``."""

from __future__ import annotations

from typing import Any, Callable, Protocol

__all__ = ["DLPackArray"]


class DLPackArray(Protocol):
    """An array exporting DLPack (a CPU torch tensor): the native calls read it through a
    numpy view of its memory, without a copy, and refuse another device."""

    @property
    def __dlpack__(self) -> Callable[..., Any]:
        """The exporter (``obj.__dlpack__(...)`` gives a DLPack capsule)."""

    def __dlpack_device__(self) -> Any:
        """``(device_type, device_id)``; 1 is the CPU."""
