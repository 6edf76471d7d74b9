"""pykvpool.hf's integer arguments: numpy integers and 0-d integer tensors are integers, as
everywhere in pykvpool; a bool or a value out of range is an InvalidArgumentError naming the
argument, a value of another type a TypeError; a refused call changes nothing."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pykvpool  # noqa: E402
import pykvpool.hf as phf  # noqa: E402
from pykvpool.checks import check_count, check_int, integer_value  # noqa: E402
from tiny import build  # noqa: E402

PROMPTS = [[3, 4, 5, 6, 7], [8, 9, 10]]
#: The same integer as int, numpy scalars, 0-d numpy array and 0-d tensors.
FIVES = [5, np.int64(5), np.int32(5), np.uint8(5), np.array(5), torch.tensor(5), torch.tensor(5, dtype=torch.int32)]
NOT_INTS = [5.0, np.float32(5), torch.tensor(5.0), np.array([5]), torch.tensor([5]), "5", None]
BOOLS = [True, np.True_, torch.tensor(True)]


@pytest.fixture(scope="module")
def model() -> Any:
    return build("llama", phf.ATTN_IMPLEMENTATION)


def test_integer_value() -> None:
    assert [integer_value(v) for v in FIVES] == [5] * len(FIVES)
    assert [integer_value(v) for v in NOT_INTS + BOOLS] == [None] * (len(NOT_INTS) + len(BOOLS))
    for v in BOOLS:
        with pytest.raises(pykvpool.InvalidArgumentError, match="n must be an int, got bool"):
            check_int(v, "n")
    with pytest.raises(TypeError, match="n must be an int, got float"):
        check_int(2.5, "n")
    with pytest.raises(pykvpool.InvalidArgumentError, match="n must be an int, got float"):
        check_count(2.5, "n")  # the planner's and simulator's check: a wrong type is a wrong value there
    assert check_int(np.int64(-3), "n", None) == -3


#: An eos id ``t`` as a numpy scalar, a 0-d array or tensor, a list or 1-D array or tensor of them.
EOS_FORMS = [int, np.int64, np.uint8, np.array, torch.tensor, lambda t: torch.tensor(t, dtype=torch.int32),
             lambda t: [np.int64(t)], lambda t: torch.tensor([t, 96]), lambda t: np.array([96, t])]


@pytest.mark.parametrize("form", EOS_FORMS)
def test_eos_token_id_of_numpy_or_torch_integers(model: Any, form: Any) -> None:
    b = phf.ContinuousBatcher(model, num_blocks=16, block_size=4)
    free = b.run(PROMPTS, 6)
    t = free[0][2]
    assert b.run(PROMPTS, 6, eos_token_id=form(t)) == [o[:o.index(t) + 1] if t in o else o for o in free]


@pytest.mark.parametrize("bad, err", [(True, pykvpool.InvalidArgumentError), (np.True_, pykvpool.InvalidArgumentError),
                                      (torch.tensor(True), pykvpool.InvalidArgumentError),
                                      (-1, pykvpool.InvalidArgumentError),
                                      (np.int64(-1), pykvpool.InvalidArgumentError),
                                      ([5, -2], pykvpool.InvalidArgumentError), (2.5, TypeError),
                                      (torch.tensor(5.0), TypeError), ("5", TypeError), ([5, 2.0], TypeError),
                                      (torch.tensor([[5]]), TypeError)])
def test_bad_eos_token_id_is_refused(model: Any, bad: Any, err: type[Exception]) -> None:
    b = phf.ContinuousBatcher(model, num_blocks=16, block_size=4)
    with pytest.raises(err, match="eos_token_id"):
        b.run(PROMPTS, 4, eos_token_id=bad)
    assert b.stats.steps == 0 and b.cache.pool.num_seqs == 0


def test_counts_of_numpy_or_torch_integers(model: Any) -> None:
    b = phf.ContinuousBatcher(model, num_blocks=np.int64(16), block_size=torch.tensor(4), max_running=np.int32(2),
                              max_batched_tokens=torch.tensor(8), chunk_size=np.array(4))
    want = phf.ContinuousBatcher(model, num_blocks=16, block_size=4, max_running=2, max_batched_tokens=8,
                                 chunk_size=4).run(PROMPTS, 5)
    assert b.run(PROMPTS, np.int64(5)) == want and b.run(PROMPTS, torch.tensor(5)) == want
    assert b.run([torch.tensor(p) for p in PROMPTS], 5) == want  # a prompt as a 1-D tensor of token ids
    assert b.run(np.array([PROMPTS[0]]), 5) == want[:1]
    out, _ = phf.generate_continuous(model, PROMPTS, torch.tensor(5), num_blocks=torch.tensor(16), block_size=4)
    assert out == phf.generate_continuous(model, PROMPTS, 5, num_blocks=16, block_size=4)[0]


@pytest.mark.parametrize("kw", ["num_blocks", "block_size", "max_running", "max_batched_tokens", "chunk_size"])
def test_bad_batcher_counts(model: Any, kw: str) -> None:
    for bad, err in ((True, pykvpool.InvalidArgumentError), (0, pykvpool.InvalidArgumentError),
                     (np.int64(-4), pykvpool.InvalidArgumentError), (4.0, TypeError), (torch.tensor(4.0), TypeError)):
        with pytest.raises(err, match=kw):
            phf.ContinuousBatcher(model, **{"num_blocks": 16, kw: bad})


def test_bad_run_counts_and_tokens(model: Any) -> None:
    b = phf.ContinuousBatcher(model, num_blocks=16, block_size=4)
    for bad, err in ((True, pykvpool.InvalidArgumentError), (np.int64(0), pykvpool.InvalidArgumentError),
                     (2.0, TypeError), (torch.tensor(2.0), TypeError)):
        with pytest.raises(err, match="max_new_tokens"):
            b.run(PROMPTS, bad)
    for bad, err in ((True, pykvpool.InvalidArgumentError), (np.int64(97), pykvpool.InvalidArgumentError),
                     (torch.tensor(-1), pykvpool.InvalidArgumentError), (2.0, TypeError),
                     (torch.tensor(2.0), TypeError)):
        with pytest.raises(err, match="prompt 1"):
            b.run([[3, 4], [5, bad]], 2)
    assert b.stats.steps == 0 and b.cache.pool.num_seqs == 0


def test_cache_integer_arguments(model: Any) -> None:
    cache = phf.PagedKvCache(model.config, num_blocks=np.int64(32), block_size=torch.tensor(4),
                             first_seq_id=np.uint8(3))
    assert cache.pool.num_blocks == 32 and cache.pool.block_size == 4
    for kw, bad, err in (("num_blocks", 3.0, TypeError), ("block_size", np.True_, pykvpool.InvalidArgumentError),
                         ("first_seq_id", -1, pykvpool.InvalidArgumentError)):
        with pytest.raises(err, match=kw):
            phf.PagedKvCache(model.config, **{"num_blocks": 32, kw: bad})
    cache.schedule([np.int64(3), torch.tensor(4)], [torch.tensor(2), np.int32(1)])
    assert cache.ragged == {3, 4} and cache.pool.seq_len(4) == 1
    with pytest.raises(TypeError, match="num_tokens"):
        cache.schedule([3], [1.0])
    with pytest.raises(TypeError, match="seq_ids"):
        cache.schedule([torch.tensor(3.0)], [1])
    with pytest.raises(TypeError, match="seq_id"):
        cache.free_sequence(3.0)
    cache.free_sequence(torch.tensor(3))
    cache.free_sequence(np.int64(4))
    assert cache.ragged == set() and cache.pool.num_used_blocks == 0


def test_row_edits_check_their_integers_first(model: Any) -> None:
    cache = phf.PagedKvCache(model.config, num_blocks=64, block_size=4)
    with torch.no_grad():
        model.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), cache=cache, max_new_tokens=3, do_sample=False)
    seqs, seen, used = list(cache.seqs), cache.get_seq_length(), cache.pool.num_used_blocks
    refused = [(lambda: cache.reorder_cache(torch.tensor([0, 2])), pykvpool.InvalidArgumentError, "beam_idx"),
               (lambda: cache.reorder_cache(torch.tensor([1, -1])), pykvpool.InvalidArgumentError, "beam_idx"),
               (lambda: cache.batch_select_indices(torch.tensor([0.0])), TypeError, "indices"),
               (lambda: cache.batch_repeat_interleave(0), pykvpool.InvalidArgumentError, "repeats"),
               (lambda: cache.batch_repeat_interleave(2.0), TypeError, "repeats"),
               (lambda: cache.crop(True), pykvpool.InvalidArgumentError, "tokens_to_remove"),
               (lambda: cache.crop(-1.0), TypeError, "tokens_to_remove")]
    for call, err, match in refused:
        with pytest.raises(err, match=match):
            call()
        assert (cache.seqs, cache.get_seq_length(), cache.pool.num_used_blocks) == (seqs, seen, used)
        assert len(cache.pool) == 2
    cache.crop(np.int64(-1))
    assert cache.get_seq_length() == seen - 1
    cache.batch_repeat_interleave(np.int64(2))
    assert len(cache.seqs) == 4
    cache.reorder_cache(torch.tensor([3, 0, 1, 2]))
    assert len(cache.pool) == 4
    cache.pool.check_invariants()
