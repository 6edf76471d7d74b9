"""The pages-vs-frames benchmark's memory measurement (no timing): frame-aligned pages waste
nothing, 16-token pages on 1,560-token frames waste what the docstring derives (8 sink-page
tokens, plus 0 or 8 at the window's start and 0 or 8 after the chunk)."""

from __future__ import annotations

from benches.bench_video import memory


def test_frame_aligned_pages_waste_nothing_and_shared_pages_waste_little() -> None:
    for bs in (24, 120):
        m = memory(bs, 8)
        assert m["frame_aligned"] and m["waste_tokens"] == [0, 0] and m["waste_tokens_open"] == [0, 0]
        assert m["pages_held"][0] * bs == m["visible_tokens"]
    m = memory(16, 8)
    assert not m["frame_aligned"]
    assert m["waste_tokens"] == [8, 24] and m["waste_tokens_open"] == [16, 16]
    assert m["waste_bytes_max"] == 24 * 184_320
