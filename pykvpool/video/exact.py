"""Proof that the cached video path is exact: the toy video transformer
(:mod:`pykvpool.video.toy`) generates the same frames through a
:class:`pykvpool.video.VideoCache` (:mod:`pykvpool.video.toy_cached`) as by recomputing the
history at every denoising step, with unbounded history and with sinks + a window, several
streams batched in one cache, a LongLive prompt switch included. Frames must agree within
``1e-5 * scale``, ``scale`` = the largest ``|value|`` of any recomputed clean frame.

The recompute route runs, at each denoising step, every clean frame the cache's history
depends on (every earlier frame; after a prompt switch, the rewritten window and what
followed) plus the noisy chunk, each query masked to its own visible frames. Running only
the frames the current chunk sees would not be exact with a window: a window frame's cached
K/V were computed when it saw *its* window, which has since been evicted.

FLOP formula (matrix products only, 2 FLOPs per multiply-add, counted as computed). Sizes:
``L`` layers, width ``D``, KV width ``Dk``, MLP width ``Ff``, ``C`` channels, ``E``
frequency-embedding width, ``Hq`` heads of ``d``; a chunk has ``n = F tpf`` tokens; ``S``
denoising steps. Per token and layer ``P = 2 (2 D^2 + 2 D Dk + 2 D Ff)`` (q, o, k, v, MLP);
per token ``2 C D`` (patch embedding); per output row ``2 D C``; per condition
``Q = 2 E D + 2 D^2 + 12 L D^2`` (timestep MLP, the blocks' modulation) plus ``4 D^2`` when
the output head runs; per (query, key) pair and layer ``A = 4 Hq d``. A forward over ``N``
tokens with ``K`` conditions, ``h`` output rows and ``p`` attended pairs costs

    fwd(N, K, h, p) = N (L P + 2 C D) + K Q + [h > 0] (4 K D^2 + 2 h D C) + L A p.

Chunk ``c`` of a stream, ``H_c`` recomputed history tokens (``c F tpf``; after a switch at
``s``: the sinks below ``b = max(0, s F - W)`` and the frames ``b .. c F``), ``V_c`` cached
tokens it sees (``min(c F, sinks + W) tpf``, ``c F tpf`` unbounded):

    recompute_c = S fwd(H_c + n, 1 + [H_c > 0], n, (H_c + n)^2)      (dense attention)
    cached_c    = S fwd(n, 1, n, n (V_c + n)) + fwd(n, 1, 0, n (V_c + n))   (+ clean pass)

plus, for a switch, the rewrite ``fwd(V_s, 1, 0, V_s^2)`` on the cached side. Unbounded,
over ``N_c`` chunks the projections give a ratio near ``S / (S + 1) (N_c + 1) / 2`` and
the attention near ``S / (S + 1) (2 N_c + 1) / 3`` (sums of ``c`` and ``c^2``); with a
window the cached side stops growing while the recompute keeps growing. The exact figures
come from :func:`flops_recompute` and :func:`flops_cached`; the tests check them against
the FLOPs the model counts as it runs.

Run ``python -m pykvpool.video.exact`` for the figures and the wall-clock ratio (on a
shared machine with ``OPENBLAS_NUM_THREADS=1``: these matrices are small, and BLAS threads
competing for busy cores slow numpy down several times). The recompute route runs in numpy,
the cached route's chunk attention in the Rust kernel (on its own threads).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import numpy as np

from pykvpool.video.toy import (
    FlopCounter,
    StreamSpec,
    VideoToyConfig,
    Window,
    generate_recompute,
    make_model,
)
from pykvpool.video.toy_cached import generate_cached

__all__ = ["ExactResult", "SCENARIOS", "flops_cached", "flops_recompute", "formula_ratio", "main", "run"]

#: The two runs of the proof: (window, streams). Frames, start rounds and switches differ
#: per stream; the window run evicts several times (1 sink + 4 window frames over 16).
SCENARIOS: dict[str, tuple[Window, list[StreamSpec]]] = {
    "unbounded": (Window(), [StreamSpec(prompt=1, seed=11, frames=12),
                             StreamSpec(prompt=2, seed=12, frames=8, start=1, switch=(2, 7))]),
    "window": (Window(sink_frames=1, window_frames=4),
               [StreamSpec(prompt=3, seed=21, frames=16),
                StreamSpec(prompt=4, seed=22, frames=12, start=1, switch=(3, 8)),
                StreamSpec(prompt=5, seed=23, frames=8, start=2)]),
}


def _fwd(cfg: VideoToyConfig, n: int, k: int, h: int, pairs: int) -> int:
    d, c = cfg.d_model, cfg.channels
    per_tok = 2 * (2 * d * d + 2 * d * cfg.d_kv + 2 * d * cfg.d_ffn)
    cond = 2 * cfg.freq_dim * d + 2 * d * d + 12 * cfg.n_layer * d * d
    head = 4 * k * d * d + 2 * h * d * c if h else 0
    return n * (cfg.n_layer * per_tok + 2 * c * d) + k * cond + head + cfg.n_layer * 4 * cfg.n_q_head * cfg.d_head * pairs


def _history(cfg: VideoToyConfig, win: Window, spec: StreamSpec, c: int) -> tuple[int, int]:
    """(recomputed history tokens, cached visible tokens) before chunk ``c``."""
    fpc, tpf = cfg.frames_per_chunk, cfg.tokens_per_frame
    end = c * fpc
    if win.window_frames is None:
        return end * tpf, end * tpf
    seen = min(end, win.sink_frames + win.window_frames)
    if spec.switch is None or c < spec.switch[0]:
        return end * tpf, seen * tpf
    base = max(0, spec.switch[0] * fpc - win.window_frames)
    return (min(win.sink_frames, base) + end - base) * tpf, seen * tpf


def flops_recompute(cfg: VideoToyConfig, win: Window, specs: list[StreamSpec]) -> int:
    """Matmul FLOPs of the recompute route for ``specs`` (the module doc's formula).

    Raises:
        Nothing.
    """
    n, steps, total = cfg.chunk_tokens, len(cfg.sigmas), 0
    for spec in specs:
        for c in range(spec.frames // cfg.frames_per_chunk):
            h = _history(cfg, win, spec, c)[0]
            total += steps * _fwd(cfg, h + n, 1 + (h > 0), n, (h + n) ** 2)
    return total


def flops_cached(cfg: VideoToyConfig, win: Window, specs: list[StreamSpec]) -> int:
    """Matmul FLOPs of the cached route for ``specs`` (the module doc's formula); the
    kernel's attention counts the visible (query, key) pairs.

    Raises:
        Nothing.
    """
    n, steps, total = cfg.chunk_tokens, len(cfg.sigmas), 0
    for spec in specs:
        for c in range(spec.frames // cfg.frames_per_chunk):
            v = _history(cfg, win, spec, c)[1]
            if spec.switch is not None and spec.switch[0] == c and v:
                total += _fwd(cfg, v, 1, 0, v * v)
            total += steps * _fwd(cfg, n, 1, n, n * (v + n)) + _fwd(cfg, n, 1, 0, n * (v + n))
    return total


def formula_ratio(cfg: VideoToyConfig, win: Window, frames: int) -> float:
    """FLOP ratio recompute / cached of one stream of ``frames`` frames, by formula.

    Raises:
        ZeroDivisionError: ``frames`` below one chunk (no work on either side).
    """
    spec = [StreamSpec(prompt=0, seed=0, frames=frames)]
    return flops_recompute(cfg, win, spec) / flops_cached(cfg, win, spec)


@dataclass(frozen=True)
class ExactResult:
    """One scenario: streams and frames, the largest difference between the routes' clean
    frames and its scale (largest ``|value|`` of the recomputed frames), matmul FLOPs
    counted while running and by formula, the FLOP ratio, wall-clock seconds of each route
    (best of the repeats) and their ratio, the most tokens a stream kept stored after a
    commit, and the pool's blocks in use once every stream was released."""

    scenario: str
    streams: int
    frames: list[int]
    max_abs_diff: float
    scale: float
    flops_recompute: int
    flops_cached: int
    formula_recompute: int
    formula_cached: int
    flops_ratio: float
    seconds_recompute: float
    seconds_cached: float
    wall_ratio: float
    max_stored_tokens: list[int]
    blocks_used_after: int

    @property
    def agrees(self) -> bool:
        """Every frame within ``1e-5 * scale``.

        Raises:
            Nothing.
        """
        return self.max_abs_diff <= 1e-5 * self.scale


def run(scenario: str = "window", cfg: VideoToyConfig | None = None, repeats: int = 1) -> ExactResult:
    """Both routes on ``SCENARIOS[scenario]``; each timed as the best of ``repeats`` runs
    (wall clock, seconds; FLOPs from the first run).

    Raises:
        KeyError: an unknown ``scenario``.
        InvalidArgumentError: sizes in ``cfg`` the cache refuses.
    """
    cfg = cfg or VideoToyConfig()
    win, specs = SCENARIOS[scenario]
    model = make_model(cfg)
    fc_r, fc_c = FlopCounter(), FlopCounter()
    t_r = t_c = float("inf")
    for i in range(max(1, repeats)):
        fr, fc = (fc_r, fc_c) if i == 0 else (FlopCounter(), FlopCounter())
        t = time.perf_counter()
        ref = [generate_recompute(model, s, win, fr) for s in specs]
        t_r = min(t_r, time.perf_counter() - t)
        t = time.perf_counter()
        got = generate_cached(model, specs, win, fc)
        t_c = min(t_c, time.perf_counter() - t)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(got.frames, ref))
    return ExactResult(
        scenario=scenario, streams=len(specs), frames=[s.frames for s in specs], max_abs_diff=diff,
        scale=max(float(np.abs(r).max()) for r in ref), flops_recompute=fc_r.total, flops_cached=fc_c.total,
        formula_recompute=flops_recompute(cfg, win, specs), formula_cached=flops_cached(cfg, win, specs),
        flops_ratio=flops_recompute(cfg, win, specs) / flops_cached(cfg, win, specs),
        seconds_recompute=t_r, seconds_cached=t_c, wall_ratio=t_r / t_c,
        max_stored_tokens=got.max_stored_tokens, blocks_used_after=got.blocks_used_after)


def main(argv: list[str] | None = None) -> int:
    """``python -m pykvpool.video.exact [--json] [--repeats N] [--scenario NAME]``: run
    both routes and print the comparison. Returns 0 when every scenario agrees within
    ``1e-5`` of its scale and the counted FLOPs equal the formula, else 1.

    Raises:
        SystemExit: from argparse, for ``--help`` (status 0) or a usage error (status 2).
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--repeats", type=int, default=3, help="time each route as the best of N runs")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), action="append",
                    help="run only this scenario (repeatable; default all)")
    args = ap.parse_args(argv)
    results = [run(s, repeats=args.repeats) for s in args.scenario or list(SCENARIOS)]
    if args.json:
        print(json.dumps([asdict(r) | {"agrees": r.agrees} for r in results], indent=2))
    for r in results if not args.json else []:
        win = SCENARIOS[r.scenario][0]
        print(f"{r.scenario}: {r.streams} streams of {r.frames} frames, sinks {win.sink_frames}, "
              f"window {win.window_frames}")
        print(f"  frames max |diff|   : {r.max_abs_diff:.3e} (scale {r.scale:.4f}, "
              f"relative {r.max_abs_diff / r.scale:.2e})")
        print(f"  matmul FLOPs        : recompute {r.flops_recompute:.4e}, cached {r.flops_cached:.4e} "
              f"(formula {'equal' if (r.formula_recompute, r.formula_cached) == (r.flops_recompute, r.flops_cached) else 'DIFFERS'})")
        print(f"  FLOP ratio          : {r.flops_ratio:.2f}x")
        print(f"  wall clock          : recompute {r.seconds_recompute:.3f} s, cached {r.seconds_cached:.3f} s, "
              f"ratio {r.wall_ratio:.2f}x")
        print(f"  most tokens stored  : {r.max_stored_tokens} per stream")
    if not args.json:
        cfg = VideoToyConfig()
        for name in SCENARIOS:
            win = SCENARIOS[name][0]
            ratios = ", ".join(f"{f} frames {formula_ratio(cfg, win, f):.1f}x" for f in (16, 64, 256))
            print(f"FLOP ratio by formula, one {name} stream: {ratios}")
    ok = all(r.agrees and r.formula_recompute == r.flops_recompute and r.formula_cached == r.flops_cached
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
