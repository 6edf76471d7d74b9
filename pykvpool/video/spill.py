"""Host copies of the pages a video stream's window released, for a rewind to find again
(MAGI-1 keeps the KV of finished chunks in host memory the same way)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from pykvpool._native import KvCache
from pykvpool.checks import invalid

__all__ = ["PageSpill"]


class PageSpill:
    """``capacity`` pages of host memory holding copies of released pages, by (stream,
    logical page), as :meth:`KvCache.export_blocks` makes them. When full, storing a page
    drops the one stored earliest (its stream's oldest history first). Used by
    :class:`pykvpool.video.VideoCache` (``spill_blocks``), which checks the arguments.

    Raises:
        InvalidArgumentError: ``spill_blocks``: more pages than memory holds.
    """

    def __init__(self, kv: KvCache, capacity: int) -> None:
        self._kv = kv
        row = kv.export_blocks(np.empty(0, np.int64)).shape[1]
        try:
            self._data = np.empty((capacity, row), np.uint8)
        except MemoryError:
            raise invalid(f"spill_blocks: {capacity} pages of {row} bytes do not fit in memory") from None
        self.capacity = capacity
        self.page_bytes = row
        # (stream, logical page) -> row of `_data`, earliest stored first.
        self._rows: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._free = list(range(capacity - 1, -1, -1))
        self.spilled = self.restored = self.dropped = 0

    def store(self, stream: int, pages: npt.NDArray[np.int64], blocks: npt.NDArray[np.int64]) -> None:
        """Copy device ``blocks`` (holding ``stream``'s logical ``pages``) to host rows.

        Raises:
            InvalidArgumentError: a block id outside the cache (:meth:`KvCache.export_blocks`).
        """
        if len(pages) == 0:
            return
        rows = []
        for page in pages.tolist():
            row = self._rows.pop((stream, page), None)
            if row is None:
                if not self._free:
                    _, oldest = self._rows.popitem(last=False)
                    self._free.append(oldest)
                    self.dropped += 1
                row = self._free.pop()
            self._rows[(stream, page)] = row
            rows.append(row)
        # One copy of every page; a row given twice (more pages than rows) keeps the later
        # page, as the index does.
        self._data[rows] = self._kv.export_blocks(blocks)
        self.spilled += len(rows)

    def restore(self, stream: int, pages: npt.NDArray[np.int64], blocks: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Copy the held ``pages`` of ``stream`` into device ``blocks`` (same order).

        Returns:
            bool ``[len(pages)]``: which pages were held (and copied).

        Raises:
            InvalidArgumentError: a block id outside the cache (:meth:`KvCache.import_blocks`).
        """
        found = np.array([(stream, p) in self._rows for p in pages.tolist()], dtype=bool)
        if found.any():
            rows = [self._rows[(stream, p)] for p in pages[found].tolist()]
            self._kv.import_blocks(blocks[found], self._data[rows])
            self.restored += int(found.sum())
        return found

    def forget(self, stream: int, from_page: int = 0) -> None:
        """Drop ``stream``'s pages from logical page ``from_page`` on.

        Raises:
            Nothing.
        """
        for key in [k for k in self._rows if k[0] == stream and k[1] >= from_page]:
            self._free.append(self._rows.pop(key))

    def held(self) -> int:
        """Pages held now.

        Raises:
            Nothing.
        """
        return len(self._rows)
