"""The attention kernels' conformance grid: one parameterised grid over

    kernel (decode, decode_paged, prefill, prefill_paged) x kernel path x KV dtype x
    precision pair (q_dtype, pv_dtype) x head_dim x block size x query heads per KV head x
    KV heads x mask x scale x split size x KV heads per work item x batch lengths x data x
    fork,

checked against one float64 reference (``tests/reference/attention.py``: grouped
attention over :meth:`pykvpool.KvCache.dequantized` through the batch's own tables) with
one tolerance table, :data:`TOLERANCE`, keyed by precision pair. Outputs and LSEs are
checked (``return_lse=True``, into an ``out`` pre-filled with NaN); a paged call also
equals the padded-table call bit for bit; every (kernel, pair, cache) combination outside
:data:`VALID` is refused with InvalidArgumentError naming the pair and listing the valid
ones, ``out`` untouched.

Precision semantics, as the docstrings of ``decode_attention``/``prefill_attention``
define them: ``q_dtype="bf16"`` is ``q`` rounded to bf16 (nearest even) and
``q_dtype="int8"`` is ``q`` quantized per (sequence, query head) (``s_q = max|q| / 127``,
half to even) then dequantized: against the reference on that query they are exact (f32
rounding slack). Against the exact reference each logit moves by at most ``D``, each
output by at most ``(exp(2 D) - 1) max|V|`` and the LSE by at most ``D``; ``pv_dtype=
"bf16"`` adds ``2^-9 max|V|`` to the output, ``("f16", "f16")`` ``18 2^-11 max|V|`` where
its f16 kernel runs (avx512_fp16, block 16, head_dim a multiple of 64; exact elsewhere).

The full product is too big. The grid is a deterministic covering selection
(:func:`covering`, seeded): every pair of values of any two axes that some valid call
has, every valid (kernel, path, pair, cache), and the :data:`TUPLES` triples, each in at
least one case; a case's random details (lengths, window, sinks, chunk, cap, scale,
positions, values) come from its seed. A hypothesis test draws further cases from the
same space on every run.

Edge cases the batches carry: lengths 1, bs, bs + 1, 2 bs - 1 and 2 bs (``edges``), every
length 1..16 (``tails``: the tails of 4-, 8- and 16-key chunks), 600-3000 keys with a few
query rows (``long``: the kernels split the keys), 40-150 query rows over 300-900 keys
(``wide``), decode's empty sequence, prefill's empty query sets, query positions before,
past and far past the keys, the pool's last block (the first sequence's last block in
every case), a fork sharing the first sequence's blocks (its partial block copied on
write, then diverging), query and key magnitude 30 (``large``: logits in the thousands)
and outlier key channels.
"""

from __future__ import annotations

import itertools
import platform
import random
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference.attention import F32, F64, Batch, Mask, Ref, bf16_round, int8_codes, int8_query, reference

import pykvpool as kv

PATHS = kv.kernel_paths()
#: Every kernel path of this architecture, whether this CPU runs it or not.
ARCH_PATHS = ["scalar", "neon"] if platform.machine().lower() in ("aarch64", "arm64") else ["scalar", "avx2", "avx512"]
KERNELS = ["decode", "decode_paged", "prefill", "prefill_paged"]
DTYPES = ["f32", "f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"]
FP8 = ("fp8_e4m3", "fp8_e5m2")
Pair = tuple[str, str]
PAIRS: list[Pair] = [("f32", "f32"), ("bf16", "f32"), ("int8", "f32"), ("f16", "f16"), ("f32", "bf16"), ("bf16", "bf16")]
OPERANDS = ["f32", "bf16", "f16", "int8"]

#: (kernel family, precision pair) -> the caches it is valid on; every other combination is refused.
VALID: dict[tuple[str, Pair], tuple[str, ...]] = {
    ("decode", ("f32", "f32")): tuple(DTYPES),
    ("decode", ("bf16", "f32")): ("bf16", *FP8),
    ("decode", ("int8", "f32")): ("int8",),
    ("decode", ("f16", "f16")): FP8,
    ("prefill", ("f32", "f32")): tuple(DTYPES),
    ("prefill", ("bf16", "f32")): ("bf16", *FP8),
    ("prefill", ("f32", "bf16")): ("bf16",),
    ("prefill", ("bf16", "bf16")): ("bf16",),
}


def family(kernel: str) -> str:
    return kernel.split("_")[0]


def valid(kernel: str, pair: Pair, dtype: str) -> bool:
    return dtype in VALID.get((family(kernel), pair), ())


# ------------------------------------------------------------------- tolerance table

#: The query roundings that define a precision exactly (the reference applies them to q).
ROUNDING: dict[str, Callable[[F32], npt.NDArray[np.floating]]] = {"bf16": bf16_round, "int8": int8_query}

Tol = tuple[Any, Any]  # (bound on |out - ref| per (row, head), bound on |lse - ref|), broadcastable


@dataclass
class Data:
    """What a tolerance is a function of: the exact reference, the rounded-query one (for
    a ``q_dtype`` in :data:`ROUNDING`), the call's scale and head_dim, the int8 query's
    scales per (row, head), and whether the f16 kernel runs."""

    exact: Ref
    rounded: Ref | None
    scale: float
    head_dim: int
    s_q: F64
    f16_kernel: bool


def f32_slack(r: Ref) -> Tol:
    """f32 arithmetic: 1e-5 of the output scale, plus the rounding of scores of magnitude
    ``lmax`` (about ``lmax * 6e-8`` per term, moving weights by that relative amount; a
    soft cap, 1-Lipschitz, passes a score's error on to its logit at most undiminished)."""
    scale = max(float(np.abs(r.out).max(initial=0.0)), 1e-30)
    lse = np.where(r.seen, np.abs(r.lse), 0.0)
    return scale * (1e-5 + 4e-7 * r.lmax), 1e-5 * lse + 1e-5 * max(1.0, r.lmax)


def logit_bound(r: Ref, dlogit: F64) -> Tol:
    """Each logit within ``D``: each weight within a factor ``exp(+-2 D)``, so each output
    within ``(exp(2 D) - 1) max|V|``, the LSE within ``D``."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(r.vmax > 0, np.expm1(2 * dlogit) * r.vmax, 0.0)
    return out, dlogit


def pv_bf16(r: Ref) -> Tol:
    """Probabilities rounded to bf16 (the softmax sum on the unrounded ones): ``2^-9 max|V|``."""
    return 2.0**-9 * r.vmax, 0.0


def f16_kernel(x: Data) -> Tol:
    """``("f16", "f16")`` where the f16 kernel runs: ``D = scale (d/4 + 3) 2^-11 max_t
    sum_i |q_i K_i|`` plus ``18 2^-11 max|V|``; exact elsewhere."""
    if not x.f16_kernel:
        return 0.0, 0.0
    out, lse = logit_bound(x.exact, x.scale * (x.head_dim / 4 + 3) * 2.0**-11 * x.exact.qk1)
    return out + 18 * 2.0**-11 * x.exact.vmax, lse


def plus(*tols: Tol) -> Tol:
    return sum(t[0] for t in tols), sum(t[1] for t in tols)


def rounded(x: Data) -> Ref:
    assert x.rounded is not None
    return x.rounded


def bf16_query(x: Data) -> Tol:
    return logit_bound(x.exact, x.scale * 2.0**-8 * x.exact.qk1)


def int8_query_bound(x: Data) -> Tol:
    return logit_bound(x.exact, x.scale * x.s_q / 2 * x.exact.k1)


#: Per precision pair: reference name ("exact", or "rounded": the reference on the
#: rounded query) -> the tolerance of output and LSE against it.
TOLERANCE: dict[Pair, Callable[[Data], dict[str, Tol]]] = {
    ("f32", "f32"): lambda x: {"exact": f32_slack(x.exact)},
    ("bf16", "f32"): lambda x: {"rounded": f32_slack(rounded(x)), "exact": plus(f32_slack(x.exact), bf16_query(x))},
    ("int8", "f32"): lambda x: {"rounded": f32_slack(rounded(x)), "exact": plus(f32_slack(x.exact), int8_query_bound(x))},
    ("f16", "f16"): lambda x: {"exact": plus(f32_slack(x.exact), f16_kernel(x))},
    ("f32", "bf16"): lambda x: {"exact": plus(f32_slack(x.exact), pv_bf16(x.exact))},
    ("bf16", "bf16"): lambda x: {"rounded": plus(f32_slack(rounded(x)), pv_bf16(rounded(x))),
                                 "exact": plus(f32_slack(x.exact), bf16_query(x), pv_bf16(x.exact))},
}

# ------------------------------------------------------------------------- the grid

AXES: dict[str, list[Any]] = {
    "kernel": KERNELS,
    "path": PATHS,
    "dtype": DTYPES,
    "pair": PAIRS,
    "head_dim": [1, 3, 7, 8, 17, 32, 33, 40, 64, 65, 72, 80, 96, 128, 130, 256],
    "block_size": [1, 3, 5, 8, 16, 32, 64],
    "group": [1, 2, 3, 4, 5, 8],  # query heads per KV head
    "kv_heads": [1, 2, 3, 4, 8],
    # prefill: "none" is the default (causal) rule; decode takes the first three.
    "mask": ["none", "window_sinks", "soft_cap", "chunked", "bidirectional", "q_positions"],
    "scale": [None, "explicit"],
    "split": [None, "small", 0],
    "kv_heads_per_item": [None, 1],  # decode only
    "lengths": ["edges", "tails", "long", "wide"],
    "data": ["normal", "outliers", "large"],
    "fork": [False, True],
}
DECODE_MASKS = ("none", "window_sinks", "soft_cap")


class Case(NamedTuple):
    kernel: str
    path: str
    dtype: str
    pair: Pair
    head_dim: int
    block_size: int
    group: int
    kv_heads: int
    mask: str
    scale: str | None
    split: Any
    kv_heads_per_item: int | None
    lengths: str
    data: str
    fork: bool
    seed: int = 0

    def id(self) -> str:
        return (f"{self.kernel}-{self.path}-{self.dtype}-{'x'.join(self.pair)}-d{self.head_dim}-bs{self.block_size}"
                f"-{self.kv_heads}x{self.group}-{self.mask}{'-scaled' if self.scale else ''}-split{self.split}"
                f"-kpi{self.kv_heads_per_item}-{self.lengths}-{self.data}{'-fork' if self.fork else ''}-s{self.seed}")


CORE = ("kernel", "pair", "dtype", "mask", "kv_heads_per_item")  # the constrained axes
#: Every valid assignment of the constrained axes.
VALID_CORE = [dict(zip(CORE, t)) for t in itertools.product(*(AXES[a] for a in CORE))
              if valid(t[0], t[1], t[2]) and (t[0].startswith("prefill") or t[3] in DECODE_MASKS)
              and (t[0].startswith("decode") or t[4] is None)]
#: Beyond all pairs of axes, these combinations are covered in full.
TUPLES = [("kernel", "path", "pair", "dtype"), ("path", "dtype", "data"), ("path", "dtype", "lengths"),
          ("path", "dtype", "mask"), ("kernel", "path", "mask"), ("kernel", "path", "lengths"),
          ("kernel", "split", "lengths"), ("path", "split", "lengths")]
#: And these cases of the f16 kernel's shape (its block size and head_dims).
EXTRA = [(("path", PATHS[-1]), ("dtype", dt), ("pair", ("f16", "f16")), ("head_dim", d), ("block_size", 16))
         for dt in FP8 for d in (64, 128, 256)]
Req = tuple[tuple[str, Any], ...]


def requirements() -> dict[Req, None]:
    """Every requirement some valid case meets (an insertion-ordered set: deterministic)."""
    names = list(AXES)
    combos = [c for c in itertools.combinations(names, 2)] + TUPLES
    reqs: dict[Req, None] = {}
    for combo in combos:
        ordered = tuple(sorted(combo, key=names.index))
        for values in itertools.product(*(AXES[a] for a in ordered)):
            reqs[tuple(zip(ordered, values))] = None
    for extra in EXTRA:
        reqs[extra] = None
    return {r: None for r in reqs if any(all(core.get(a, v) == v for a, v in r) for core in VALID_CORE)}


def keys_of(case: dict[str, Any]) -> list[Req]:
    names = list(AXES)
    keys = [((a, case[a]), (b, case[b])) for a, b in itertools.combinations(names, 2)]
    for combo in TUPLES:
        ordered = sorted(combo, key=names.index)
        keys.append(tuple((a, case[a]) for a in ordered))
    keys += [e for e in EXTRA if all(case[a] == v for a, v in e)]
    return keys


def covering(seed: int = 0, candidates: int = 24) -> list[Case]:
    """A greedy covering selection (AETG): each new case is the best of ``candidates``
    random valid completions of uncovered requirements."""
    rnd = random.Random(seed)
    todo = requirements()
    cases: list[Case] = []
    while todo:
        pending = list(todo)
        best: tuple[int, dict[str, Any]] | None = None
        for n in range(candidates):
            req = dict(pending[0] if n == 0 else rnd.choice(pending))
            cand = dict(rnd.choice([c for c in VALID_CORE if all(c[a] == v for a, v in req.items() if a in c)]))
            for a, values in AXES.items():
                if a not in cand:
                    cand[a] = req[a] if a in req else rnd.choice(values)
            score = sum(k in todo for k in keys_of(cand))
            if best is None or score > best[0]:
                best = (score, cand)
        assert best is not None and best[0] > 0
        for k in keys_of(best[1]):
            todo.pop(k, None)
        cases.append(Case(**best[1], seed=len(cases)))
    return cases


CASES = covering()

# ------------------------------------------------------------------ building a case


def build(c: Case) -> tuple[Batch, F32, Mask, kv.KernelTuning]:
    """The batch, query, mask and tuning of a case, its random details from its seed."""
    rng = np.random.default_rng(c.seed)
    bs, hkv, d, hq = c.block_size, c.kv_heads, c.head_dim, c.kv_heads * c.group
    decode = family(c.kernel) == "decode"
    if c.lengths == "edges":
        lens = [bs + 1, 1, bs, 2 * bs - 1 if bs > 1 else 3, 2 * bs, int(rng.integers(2, 300)), 0]
    elif c.lengths == "tails":  # the tails of 4-, 8- and 16-key chunks
        lens = [70, *range(1, 17)]
    elif c.lengths == "long":  # few query rows: prefill splits the keys by itself
        lens = [int(rng.integers(600, 3000)), 1, bs + 1]
    else:  # many query tiles over many key tiles
        lens = [int(rng.integers(300, 900)), 1, bs + 1]
    # Tables over a shuffled pool: the pool's last block is the first sequence's last block.
    need = [-(-n // bs) for n in lens]
    tables: list[list[int]] = []
    fork_extra = int(rng.choice([0, 1, int(rng.integers(2, 40))])) if c.fork else 0
    n0 = lens[0]
    shared = n0 // bs + (1 if fork_extra == 0 and n0 % bs else 0)
    fork_own = -(-(n0 + fork_extra) // bs) - shared if c.fork else 0
    nb = sum(need) + fork_own + 2
    ids = [int(x) for x in rng.permutation(nb - 1)]
    tables.append([ids.pop() for _ in range(need[0] - 1)] + [nb - 1])  # every case reads it
    tables += [[ids.pop() for _ in range(m)] for m in need[1:]]
    if c.fork:  # shares the first sequence's blocks, then its own (the partial one copied)
        tables.append(tables[0][:shared] + [ids.pop() for _ in range(fork_own)])
        lens.append(n0 + fork_extra)
    kmag, qmag = (30.0, 30.0) if c.data == "large" else (1.0, 1.0)
    cache = kv.KvCache(1, nb, bs, hkv, d, c.dtype)
    k = (rng.standard_normal((nb * bs, hkv, d)) * kmag).astype(np.float32)
    if c.data == "outliers":  # a few K channels 20x larger, as in real K caches
        k[..., :: max(1, d // 4)] *= 20
    cache.write(0, k, rng.standard_normal((nb * bs, hkv, d)).astype(np.float32), np.arange(nb * bs))
    if c.fork and fork_extra and n0 % bs:  # copy-on-write of the shared partial block, then diverge
        src, dst = tables[0][n0 // bs], tables[-1][n0 // bs]
        cache.copy_blocks([[src, dst]])
        slots = dst * bs + np.arange(n0 % bs, bs)
        new = (rng.standard_normal((len(slots), hkv, d)) * kmag).astype(np.float32)
        cache.write(0, new, rng.standard_normal((len(slots), hkv, d)).astype(np.float32), slots)

    wl = int(rng.choice([0, 1, max(bs - 1, 0), bs, 2 * bs + 3, int(rng.integers(0, 100))]))
    sinks = int(rng.choice([0, 1, bs, int(rng.integers(0, 20))]))
    windowed = dict(window_left=wl, sinks=sinks)
    scale = float(rng.choice([0.3, 0.2, 0.05])) if c.scale else None
    mask = {
        "none": lambda: Mask(),
        "window_sinks": lambda: Mask(**windowed),
        "soft_cap": lambda: Mask(cap=float(rng.choice([5.0, 30.0]))),
        "chunked": lambda: Mask(chunk_size=int(rng.choice([7, bs, 24, int(rng.integers(1, 80))])),
                                **(windowed if rng.random() < 0.5 else {})),
        "bidirectional": lambda: Mask(causal=False, **(windowed if rng.random() < 0.3 else {})),
        "q_positions": lambda: Mask(**(windowed if rng.random() < 0.5 else {})),
    }[c.mask]()
    mask = replace(mask, scale=scale)

    explicit = c.mask == "q_positions"
    if decode:
        nq = [1] * len(lens)
        positions = np.array(lens, np.int64) - 1
    else:
        nq, pos = [], []
        for i, n in enumerate(lens):
            if i == 0 and c.lengths in ("long", "wide"):
                m = (150 if hq * d <= 4096 else 40) if c.lengths == "wide" else int(rng.choice([1, 2, 5]))
            elif c.lengths == "tails":
                m = int(rng.integers(0, min(n, 3) + 1))
            else:
                top = min(n, 64 if hq * d <= 4096 else 16)
                m = int(rng.choice([0, 1, top, int(rng.integers(0, top + 1))]))
            if not explicit:
                m = min(m, n)
            if explicit:  # any positions: repeated, before the keys, past them, far past them
                m = m if n else int(rng.integers(0, 3))
                p = rng.integers(0, n + bs + 1, m)
                p[rng.random(m) < 0.1] = 1000
            else:
                p = np.arange(n - m, n)
            nq.append(m)
            pos.append(p)
        positions = np.concatenate(pos).astype(np.int64)
    qo = [int(x) for x in np.cumsum([0, *nq])]
    q = (rng.standard_normal((qo[-1], hq, d)) * qmag).astype(np.float32)
    split = int(rng.choice([1, 16, 64])) if c.split == "small" else c.split
    tuning = kv.KernelTuning(isa=c.path, split_size=split, kv_heads_per_item=c.kv_heads_per_item)  # type: ignore[arg-type]
    return Batch(cache, tables, lens, qo, positions, explicit), q, mask, tuning


def call(kernel: str, b: Batch, q: F32, mask: Mask, pair: Pair, tuning: kv.KernelTuning,
         out: F32 | None) -> tuple[F32, F32]:
    """One call of ``kernel`` on the batch, with ``return_lse=True``."""
    kw: dict[str, Any] = dict(scale=mask.scale, out=out, return_lse=True, logits_soft_cap=mask.cap,
                              window_left=mask.window_left, sink_tokens=mask.sinks, q_dtype=pair[0],
                              pv_dtype=pair[1], tuning=tuning)
    if family(kernel) == "prefill":
        kw.update(causal=mask.causal, chunk_size=mask.chunk_size, q_positions=b.positions if b.explicit else None)
    if kernel.endswith("_paged"):
        indptr, indices, last, starts = b.pages(mask)
        fn = kv.decode_attention_paged if kernel == "decode_paged" else kv.prefill_attention_paged
        if family(kernel) == "prefill":
            return fn(b.cache, 0, q, b.qo, indptr, indices, last, kv_page_start=starts, **kw)  # type: ignore[no-any-return]
        return fn(b.cache, 0, q, indptr, indices, last, kv_page_start=starts, **kw)  # type: ignore[no-any-return]
    if kernel == "decode":
        return kv.decode_attention(b.cache, 0, q, b.padded(), b.lens, **kw)  # type: ignore[no-any-return]
    return kv.prefill_attention(b.cache, 0, q, b.qo, b.padded(), b.lens, **kw)  # type: ignore[no-any-return]


def refusal(kernel: str, pair: Pair, dtype: str) -> str:
    listed = ", ".join(f"({a}, {b})" for a, b in PAIRS if valid(kernel, (a, b), dtype))
    return (f"q_dtype={pair[0]} with pv_dtype={pair[1]} is not a {family(kernel)} precision for {dtype} caches; "
            f"valid (q_dtype, pv_dtype) there: {listed}")


def f16_kernel_runs(c: Case) -> bool:
    """Whether ``("f16", "f16")`` runs the f16 kernel (every other path, block size and
    head_dim computes it exactly)."""
    return c.path == "avx512" and "avx512fp16" in kv.cpu_features() and c.head_dim % 64 == 0 and c.block_size == 16


def check(what: str, got: F32, lse: F32, ref: Ref, tol: Tol) -> None:
    out_tol = np.broadcast_to(tol[0], ref.lse.shape)
    lse_tol = np.broadcast_to(tol[1], ref.lse.shape)
    assert np.isfinite(got).all(), f"{what}: a non-finite output"
    seen = ref.seen
    assert (np.isneginf(lse) == ~seen).all(), f"{what}: -inf LSE exactly where a row sees no key"
    assert (got[~seen] == 0).all(), f"{what}: a row that sees no key is zero"
    err = np.abs(got.astype(np.float64) - ref.out).max(axis=-1, initial=0.0)
    over = err - out_tol
    if (over > 0).any():
        r, h = np.unravel_index(int(np.argmax(over)), over.shape)
        raise AssertionError(f"{what}: output error {err[r, h]:.3e} > tolerance {out_tol[r, h]:.3e} at row {r} head {h}")
    lerr = np.where(seen, np.abs(lse.astype(np.float64) - np.where(seen, ref.lse, 0.0)), 0.0)
    over = lerr - lse_tol
    if (over > 0).any():
        r, h = np.unravel_index(int(np.argmax(over)), over.shape)
        raise AssertionError(f"{what}: LSE error {lerr[r, h]:.3e} > tolerance {lse_tol[r, h]:.3e} at row {r} head {h}")


def run_case(c: Case) -> None:
    """Run a case's call and check it: against the reference(s) within :data:`TOLERANCE`,
    or refused when the pair is not valid there."""
    b, q, mask, tuning = build(c)
    out = np.full(q.shape, np.nan, np.float32)
    if not valid(c.kernel, c.pair, c.dtype):
        out[...] = 7.0
        with pytest.raises(kv.InvalidArgumentError, match=re.escape(refusal(c.kernel, c.pair, c.dtype))):
            call(c.kernel, b, q, mask, c.pair, tuning, out)
        assert (out == 7.0).all(), "a refused call wrote out"
        return
    got, lse = call(c.kernel, b, q, mask, c.pair, tuning, out)
    assert got is out and got.shape == q.shape and lse.shape == q.shape[:2] and lse.dtype == np.float32
    if c.kernel.endswith("_paged"):  # the padded tables give the same bits
        twin = call(family(c.kernel), b, q, mask, c.pair, tuning, None)
        np.testing.assert_array_equal(got, twin[0])
        np.testing.assert_array_equal(lse, twin[1])
    scale = 1 / np.sqrt(c.head_dim) if mask.scale is None else float(np.float32(mask.scale))
    data = Data(exact=reference(b, q, mask), rounded=None, scale=scale, head_dim=c.head_dim,
                s_q=int8_codes(q)[1].astype(np.float64), f16_kernel=f16_kernel_runs(c))
    if c.pair[0] in ROUNDING:
        data.rounded = reference(b, ROUNDING[c.pair[0]](q), mask)
    for name, tol in TOLERANCE[c.pair](data).items():
        check(f"{c.id()} vs {name} reference", got, lse, data.exact if name == "exact" else rounded(data), tol)


# -------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=Case.id)
def test_conformance_grid(case: Case) -> None:
    run_case(case)


@st.composite
def drawn_cases(draw: st.DrawFn) -> Case:
    core = draw(st.sampled_from(VALID_CORE))
    rest = {a: draw(st.sampled_from(v)) for a, v in AXES.items() if a not in core}
    return Case(**core, **rest, seed=draw(st.integers(0, 2**31)))


@settings(deadline=None)
@given(drawn_cases())
def test_conformance_random_cases(case: Case) -> None:
    """Further cases of the same grid, drawn afresh every run (as many as the hypothesis
    profile asks: 200 in CI, 30,000 in the soak profile)."""
    run_case(case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_pair_outside_the_table_is_refused_and_leaves_out_untouched(kernel: str, dtype: str) -> None:
    """Every (q_dtype, pv_dtype) of the four operand dtypes, on every path: the valid
    ones are :data:`VALID`'s (the grid runs them), every other one is refused naming the
    pair and listing the valid ones there, ``out`` untouched."""
    case = Case(kernel, PATHS[0], dtype, ("f32", "f32"), 64, 16, 2, 2, "window_sinks", None, None, None, "edges", "normal",
                True)
    b, q, mask, _ = build(case)
    refused = 0
    for path, pair in itertools.product(PATHS, itertools.product(OPERANDS, OPERANDS)):
        out = np.full(q.shape, 7.0, np.float32)
        tuning = kv.KernelTuning(isa=path)  # type: ignore[arg-type]
        if valid(kernel, pair, dtype):
            assert pair in PAIRS
            call(kernel, b, q, mask, pair, tuning, out)
            assert not (out == 7.0).all()
            continue
        with pytest.raises(kv.InvalidArgumentError, match=re.escape(refusal(kernel, pair, dtype))):
            call(kernel, b, q, mask, pair, tuning, out)
        assert (out == 7.0).all(), (path, pair)
        refused += 1
    assert refused == len(PATHS) * (16 - sum(valid(kernel, p, dtype) for p in PAIRS))


def test_the_grid_covers_every_value_and_the_required_combinations() -> None:
    """Every value of every axis; every valid (pair, cache), (path, cache) and (kernel,
    path, pair, cache); every requirement of :func:`covering` (pairwise and the tuples)."""
    for axis, values in AXES.items():
        assert {repr(v) for v in values} <= {repr(getattr(c, axis)) for c in CASES}, axis
    have = {(c.kernel, c.path, c.pair, c.dtype) for c in CASES}
    for kernel, path, pair, dtype in itertools.product(KERNELS, PATHS, PAIRS, DTYPES):
        assert ((kernel, path, pair, dtype) in have) == valid(kernel, pair, dtype), (kernel, path, pair, dtype)
    assert {(c.pair, c.dtype) for c in CASES} == {(p, d) for (_, p), ds in VALID.items() for d in ds}
    assert {(c.path, c.dtype) for c in CASES} == set(itertools.product(PATHS, DTYPES))
    todo = requirements()
    for c in CASES:
        for k in keys_of(c._asdict()):
            todo.pop(k, None)
    assert not todo
    assert all(valid(c.kernel, c.pair, c.dtype) for c in CASES)
    assert len({c.seed for c in CASES}) == len(CASES)


@pytest.mark.parametrize("path", [p for p in ARCH_PATHS if p not in PATHS] or ["none"])
def test_kernel_paths_this_cpu_lacks_are_reported(path: str) -> None:
    """A path of this architecture the CPU lacks is a skip with its reason (``pytest
    -ra``), never silently absent from the grid."""
    if path == "none":
        assert set(ARCH_PATHS) <= set(PATHS)
        return
    pytest.skip(f"kernel path {path} not in the grid: this CPU lacks it (kernel_paths() = {PATHS})")


INSTRUCTIONS = [  # (CPU features, kernel, pair, cache, head_dim): the avx512 path's special instructions
    (("avx512bf16",), "prefill", ("bf16", "f32"), "bf16", 128),  # vdpbf16ps scores
    (("avx512bf16",), "prefill", ("bf16", "bf16"), "bf16", 128),  # and P V over token pairs
    (("avx512bf16",), "decode", ("bf16", "f32"), "bf16", 128),
    (("avx512bf16", "avx512vbmi"), "decode", ("bf16", "f32"), "fp8_e4m3", 128),
    (("avx512vnni",), "decode", ("int8", "f32"), "int8", 128),  # vpdpbusd
    (("avx512fp16",), "decode", ("f16", "f16"), "fp8_e5m2", 128),  # f16 products and sums
]


@pytest.mark.parametrize("feats,kernel,pair,dtype,d", INSTRUCTIONS)
def test_special_instruction_paths_are_exercised_or_skipped_loudly(feats: tuple[str, ...], kernel: str, pair: Pair,
                                                                  dtype: str, d: int) -> None:
    lacking = [f for f in feats if f not in kv.cpu_features()]
    if "avx512" not in PATHS or lacking:
        pytest.skip(f"no avx512 {lacking} on this CPU: the {kernel} {pair} path on {dtype} is not exercised")
    for data in ("normal", "large"):
        run_case(Case(kernel, "avx512", dtype, pair, d, 16, 4, 2, "none", None, None, None, "edges", data, False, seed=11))


def test_bf16_round_is_nearest_even_as_the_caches_write() -> None:
    """The reference's bf16 rounding is the cache's own (round to nearest even on write)."""
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-20), 3.0e-3, -7.5e5], np.float32)
    assert bf16_round(x)[:4].tolist() == [1.0, 1.0, 1 + 2**-6, -(1 + 2**-7)]
    c = kv.KvCache(1, 1, 1, 1, 4096, "bf16")
    y = np.concatenate([x, np.random.default_rng(3).standard_normal(4096 - len(x)).astype(np.float32)])
    c.write(0, y.reshape(1, 1, 4096), y.reshape(1, 1, 4096), [0])
    np.testing.assert_array_equal(c.dequantized(0)[0].ravel(), bf16_round(y))


def test_int8_query_rounding_is_the_int8_caches_quantizer() -> None:
    """The reference's int8 query rule (per row ``max|x| / 127``, half to even) is the one
    the int8 cache writes with, ties and an all-zero row included."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 3, 40)).astype(np.float32) * 3
    x[0, 0] = 0.0
    x[1, 0, :3] = [127.0, 0.5, 1.5]  # scale 1: 0.5 and 1.5 are ties (to 0 and 2)
    x[1, 0, 3:] = 0.0
    codes, s = int8_codes(x)
    c = kv.KvCache(1, 4, 16, 3, 40, "int8")
    c.write(0, x, x, np.arange(64))
    np.testing.assert_array_equal(c.key(0).reshape(64, 3, 40), codes)
    np.testing.assert_array_equal(c.key_scales(0).reshape(64, 3), s)
    assert codes[1, 0, :3].tolist() == [127, 0, 2] and not codes[0, 0].any()
    np.testing.assert_array_equal(int8_query(x), codes.astype(np.float64) * s[..., None].astype(np.float64))
