//! The SIMD paths' prefetcher: the lines of the tiles a loop reads next, spread over
//! its steps, the next tile into L1 (x86 T0, AArch64 `pldl1keep`) and a farther one into L2
//! (T1, `pldl2keep`)
//! ([`super::work::Ahead`]). A burst of L2 lines at a tile's start stalled on the core's
//! miss buffers (3.7-4.7% of a profile's samples on `prefetcht1`); spread, bf16 decode
//! gained 20% (GQA) and 42% (MHA) on one core (`docs/experiments.md`, "Decode attention:
//! prefetch").
//! A `Prefetcher<false>` takes only the far tile's first lines instead, at once
//! ([`FAR_START_LINES`]): the exact AVX-512 path and the f16 precision's on 8-bit tiles
//! of at most [`FAR_START_MAX_BYTES`].

/// The K or the V tiles a loop prefetches: the next one into L1, a farther one into L2
/// ([`super::work::Ahead`]).
pub(crate) struct Stream<'a, E> {
    pub l1: Option<&'a [E]>,
    pub l2: Option<&'a [E]>,
}

// By hand: a derive would ask `E: Copy`, and these are only slices.
impl<E> Clone for Stream<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Stream<'_, E> {}

impl<E> Stream<'_, E> {
    /// Nothing to prefetch.
    pub(crate) const NONE: Self = Stream { l1: None, l2: None };
}

/// Prefetches the tiles of a [`Stream`], `per` bytes of each per `step`, so the misses
/// are spread over a loop instead of arriving in one burst (a burst of L2 prefetches at
/// a tile's start stalled on the core's miss buffers). The far tile's lines go at the
/// same offsets as the near one's (tiles of one shape), so a step is one test and its
/// prefetches: the hot loops have few spare registers and decode slots (a first version
/// with a bounded loop per stream spilled the score loop's strides to the stack).
///
/// `FAR_LINES` false: the far tile's first [`FAR_START_LINES`] lines go into L2 at once,
/// in [`Prefetcher::with`], and the steps prefetch the near tile only (a choice made at
/// compile time: a test per step cost what it gained, and an L2 prefetch of lines
/// already on their way cost more; `docs/experiments.md`, "Decode attention: prefetch").
pub(crate) struct Prefetcher<const FAR_LINES: bool = true> {
    near: *const i8,
    /// The far tile, or the near one again when there is none (its lines then hit the
    /// fill buffers: cheaper than a test per step).
    far: *const i8,
    /// Where the near tile's prefetching steps end (`near + steps * per`; `near` when
    /// idle), and bytes per step (a multiple of 64).
    end: *const i8,
    per: usize,
}

/// Lines of the far tile a `Prefetcher<false>` sends into L2, at its start. They set the
/// L2's own stream prefetcher on the tile's 4 KiB page, which fetches the rest of it (two
/// 8-bit tiles at head_dim 128 and block size 16), while the core's miss buffers stay
/// free for the near tile's lines. The wider tiles, the integer dot-product paths (whose
/// short loops gain nothing or lose from it) and the e4m3 table path (no gain) keep every
/// far line spread over the steps: `docs/experiments.md`, "Decode attention: prefetch".
pub(crate) const FAR_START_LINES: usize = 2;

/// K or V tiles of at most this many bytes may take [`FAR_START_LINES`] (4 KiB tiles, a
/// page each, read 1-3% slower with them: 8-bit tiles at block size 32, and bf16).
pub(crate) const FAR_START_MAX_BYTES: usize = 2 << 10;

/// Whether a path's tiles of `tile` elements of `E` take only the far tile's first lines
/// (`Prefetcher<false>`): 8-bit codes, at most [`FAR_START_MAX_BYTES`] a tile.
pub(crate) fn first_far_lines<E: crate::kv::Elem>(tile: usize) -> bool {
    E::DTYPE.is_quantized() && tile * std::mem::size_of::<E>() <= FAR_START_MAX_BYTES
}

impl<const FAR_LINES: bool> Prefetcher<FAR_LINES> {
    /// Spread `s`'s near tile's lines over `iters` steps, and its far tile's with them
    /// (`FAR_LINES`) or its first [`FAR_START_LINES`] now (not `FAR_LINES`).
    #[inline]
    pub(crate) fn with<E>(s: Stream<E>, iters: usize) -> Self {
        let Some(t) = s.l1 else {
            return Self { near: std::ptr::null(), far: std::ptr::null(), end: std::ptr::null(), per: 0 };
        };
        let lines = std::mem::size_of_val(t).div_ceil(64);
        let (per_lines, steps) = spread(lines, iters);
        // A far tile of another length (never, as tiles share a shape) is not prefetched.
        let far = s.l2.filter(|f| f.len() == t.len());
        if let (false, Some(f)) = (FAR_LINES, far) {
            let f: *const i8 = f.as_ptr().cast();
            for l in 0..FAR_START_LINES.min(lines) {
                prefetch_line::<HINT_L2, _>(f.wrapping_add(64 * l));
            }
        }
        let near: *const i8 = t.as_ptr().cast();
        let per = 64 * per_lines;
        Self { near, far: far.unwrap_or(t).as_ptr().cast(), end: near.wrapping_add(steps * per), per }
    }

    /// Prefetch the next `per` bytes of the near tile into L1 and (`FAR_LINES`) of the far one into L2
    /// (the last step may reach up to `per - 64` bytes past a tile: prefetches never fault).
    /// One line a step, the common case, takes no loop: a step is a compare, two
    /// prefetches and two adds (the hot loops have few spare issue slots: with the cache
    /// in L1, where it buys nothing, all the prefetching costs 4-13% of the time; this
    /// form of the step took 0.94-0.98x the time of a counted loop at full size on GQA, fp8 1.00,
    /// `docs/experiments.md`, "Decode attention: prefetch").
    #[inline(always)]
    pub(crate) fn step(&mut self) {
        if self.near == self.end {
            return;
        }
        prefetch_line::<HINT_L1, _>(self.near);
        if FAR_LINES {
            prefetch_line::<HINT_L2, _>(self.far);
        }
        let mut off = 64;
        while off < self.per {
            prefetch_line::<HINT_L1, _>(self.near.wrapping_add(off));
            if FAR_LINES {
                prefetch_line::<HINT_L2, _>(self.far.wrapping_add(off));
            }
            off += 64;
        }
        self.near = self.near.wrapping_add(self.per);
        self.far = self.far.wrapping_add(self.per);
    }
}

/// [`prefetch_line`]'s hints: into L1 and into L2 (x86-64's `_MM_HINT_T0` / `_T1`).
pub(crate) const HINT_L1: i32 = 3;
pub(crate) const HINT_L2: i32 = 2;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(HINT_L1 == std::arch::x86_64::_MM_HINT_T0 && HINT_L2 == std::arch::x86_64::_MM_HINT_T1);

/// Prefetch the line holding `p` with `HINT` ([`HINT_L1`], [`HINT_L2`]): `prefetcht0/1` on
/// x86-64 (SSE, in its baseline), `prfm pldl1keep / pldl2keep` on AArch64 (through `asm!`:
/// the `_prefetch` intrinsic is unstable), nothing elsewhere. Any address: a prefetch
/// never faults and makes no access.
#[inline(always)]
pub(crate) fn prefetch_line<const HINT: i32, T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults; sse is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<HINT>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a prefetch hint never faults and writes nothing.
    unsafe {
        if HINT == HINT_L1 {
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
        } else {
            std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
        }
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// Lines per step and steps that cover `lines` in at most `iters` steps (at least one):
/// one line a step when the loop has steps enough (the common case); else
/// `ceil(lines / iters)` a step. No division when both are powers of two (tiles of 2^k
/// lines over loops of 2^j steps, the usual shapes: two divisions per tile and loop were
/// measurable on the shortest loops, the integer `P V`'s).
#[inline]
fn spread(lines: usize, iters: usize) -> (usize, usize) {
    if lines <= iters {
        (1, lines)
    } else if iters.is_power_of_two() && lines.is_power_of_two() {
        (lines >> iters.trailing_zeros(), iters)
    } else {
        let per = lines.div_ceil(iters.max(1));
        (per, lines.div_ceil(per))
    }
}

#[cfg(test)]
mod tests {
    use super::{spread, Prefetcher, Stream};

    /// A prefetcher covers its tile's lines, from the first, within the loop's steps,
    /// then idles (the idle steps move nothing); no tile, no step moves.
    #[test]
    fn prefetcher_steps_cover_the_tile_then_idle() {
        for lines in [1usize, 2, 3, 16, 32, 33, 64] {
            let tile = vec![0u8; 64 * lines];
            for iters in [1usize, 2, 5, 16, 32, 64, 100] {
                let mut pf = Prefetcher::<true>::with(Stream { l1: Some(&tile[..]), l2: None }, iters);
                let first = pf.near;
                let mut moved = 0;
                for _ in 0..iters + 3 {
                    let before = pf.near;
                    pf.step();
                    if pf.near != before {
                        assert_eq!(pf.near as usize - before as usize, pf.per, "{lines} lines over {iters}");
                        moved += 1;
                    }
                }
                assert!(moved <= iters, "{lines} lines over {iters}: {moved} steps");
                assert!(pf.near as usize - first as usize >= 64 * lines, "{lines} lines over {iters}: not covered");
                assert!(pf.near as usize - first as usize - 64 * lines < pf.per, "{lines} lines over {iters}: past the tile");
            }
        }
        let mut idle = Prefetcher::<true>::with(Stream::<u8>::NONE, 8);
        idle.step();
        assert!(idle.near.is_null() && idle.near == idle.end);
    }

    /// A `Prefetcher<false>` steps over the near tile exactly as the default one (its far
    /// tile's first lines went out in `with`; the steps issue no far line, a compile-time
    /// choice that leaves nothing to observe but the cursor it no longer moves on).
    #[test]
    fn first_lines_prefetcher_steps_the_near_tile_as_the_default_one() {
        let (near, far) = (vec![0u8; 2048], vec![0u8; 2048]);
        for iters in [1usize, 8, 16, 32, 64] {
            let s = Stream { l1: Some(&near[..]), l2: Some(&far[..]) };
            let (mut a, mut b) = (Prefetcher::<true>::with(s, iters), Prefetcher::<false>::with(s, iters));
            assert_eq!((a.near, a.end, a.per), (b.near, b.end, b.per), "{iters} steps");
            assert_eq!(a.far, far.as_ptr().cast(), "the default one steps over the far tile");
            for _ in 0..iters + 2 {
                a.step();
                b.step();
                assert_eq!(a.near, b.near, "{iters} steps");
            }
        }
        // No tile: idle, as the default one.
        let idle = Prefetcher::<false>::with(Stream::<u8>::NONE, 8);
        assert!(idle.near.is_null() && idle.near == idle.end);
    }

    /// Every line is covered, within the loop's steps, by the fewest lines a step.
    #[test]
    fn spread_covers_every_line_within_the_steps() {
        for lines in 0..300 {
            for iters in 0..70 {
                let (per, steps) = spread(lines, iters);
                assert!(per * steps >= lines, "{lines} over {iters}");
                let fewest = if iters == 0 { lines.max(1) } else { lines.div_ceil(iters).max(1) };
                assert_eq!(per, fewest, "{lines} over {iters}");
                assert!(steps <= iters.max(1) || lines == 0, "{lines} over {iters}: {steps} steps");
                assert!(per * (steps.max(1) - 1) < lines.max(1), "no idle step: {lines} over {iters}");
            }
        }
    }
}
