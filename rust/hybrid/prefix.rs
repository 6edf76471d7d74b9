//! Prefix caching on layer groups: the longest hit valid for every group, and admission
//! by token ids or block keys on top of it.
//!
//! Rules (the contract of issue 13, "Prefix caching on groups"):
//!
//! - A prompt's full blocks are keyed by the chained keys of
//!   [`crate::prefix_cache::block_hash`]; the same keys serve every group and the index is
//!   per group (`(group, key) -> block`), so a key cached in one group never hits another.
//! - A hit of `h` tokens (a multiple of the block size, at most `prompt_len - 1`: at least
//!   one prompt token is computed) is valid for a group when every block the query at `h`
//!   needs before `h` is cached in that group ([`GroupSpec::needed_before`]): the whole
//!   prefix for full attention, the sinks and the window before `h` for a sliding window,
//!   the chunk of `h` for chunked attention. The admission takes the largest `h` valid for
//!   every group ([`longest_hit`]).

use super::spec::GroupSpec;

/// Memo of `cached(group, block)` answers: 0 unknown, 1 cached, 2 not.
struct Memo<F> {
    f: F,
    n: usize,
    seen: Vec<u8>,
}

impl<F: Fn(usize, usize) -> bool> Memo<F> {
    fn get(&mut self, g: usize, i: usize) -> bool {
        let s = &mut self.seen[g * self.n + i];
        if *s == 0 {
            *s = if (self.f)(g, i) { 1 } else { 2 };
        }
        *s == 1
    }
}

/// The largest hit, in blocks, in `0..=n_blocks_max` valid for every group of `specs`
/// (block size `bs` tokens), where `cached(g, i)` says whether logical block `i` of the
/// prompt is cached in group `g`. A hit of 0 blocks is always valid.
///
/// Full groups are monotone (a hit valid at `k` is valid below `k`): their leading cached
/// runs bound the hit from above. Each other group then lowers the bound to its own largest
/// valid hit at or below it, found right to left (a missing block `j` of the window rules
/// out every hit whose window holds it, so the scan jumps below `j`), until no group lowers
/// it: the fixpoint is the largest hit valid for all. `cached` is asked at most once per
/// (group, block), and for windowed groups typically only about the window's blocks.
pub fn longest_hit(specs: &[GroupSpec], bs: usize, n_blocks_max: usize, cached: impl Fn(usize, usize) -> bool) -> usize {
    let mut memo = Memo { f: cached, n: n_blocks_max, seen: vec![0; specs.len() * n_blocks_max] };
    let mut h = n_blocks_max;
    for (g, _) in specs.iter().enumerate().filter(|(_, s)| !s.is_windowed()) {
        h = (0..h).find(|&i| !memo.get(g, i)).unwrap_or(h);
    }
    // Leading cached blocks per windowed group, found so far (for the sinks).
    let mut lead = vec![0usize; specs.len()];
    loop {
        let before = h;
        for (g, s) in specs.iter().enumerate().filter(|(_, s)| s.is_windowed()) {
            h = group_best(s, bs, h, g, &mut lead[g], &mut memo);
        }
        if h == before {
            return h;
        }
    }
}

/// The largest hit at or below `k` blocks valid for windowed group `g`.
fn group_best<F: Fn(usize, usize) -> bool>(s: &GroupSpec, bs: usize, mut k: usize, g: usize, lead: &mut usize, memo: &mut Memo<F>) -> usize {
    while k > 0 {
        let [sinks, window] = s.needed_before(k * bs, bs);
        let mut j = window.end;
        while j > window.start && memo.get(g, j - 1) {
            j -= 1;
        }
        if j > window.start {
            // Block j - 1 is missing: every hit above it needs it.
            k = j - 1;
            continue;
        }
        while *lead < sinks.end && memo.get(g, *lead) {
            *lead += 1;
        }
        if *lead >= sinks.end {
            return k;
        }
        // Sink block `lead` is missing: a hit needs at most `lead` sink blocks.
        k = (*lead).min(k - 1);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// The definition: `k` is valid when every group has every block it needs cached.
    fn brute(specs: &[GroupSpec], bs: usize, n: usize, cached: &dyn Fn(usize, usize) -> bool) -> usize {
        (0..=n)
            .rev()
            .find(|&k| {
                specs.iter().enumerate().all(|(g, s)| s.needed_before(k * bs, bs).into_iter().flatten().all(|i| cached(g, i)))
            })
            .unwrap_or(0)
    }

    /// A small deterministic generator (no dependency on the proptest crate in unit tests).
    fn lcg(x: &mut u64) -> u64 {
        *x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *x >> 33
    }

    #[test]
    fn longest_hit_equals_brute_force() {
        let kinds = [
            GroupSpec::Full,
            GroupSpec::sliding_window(1, 0).unwrap(),
            GroupSpec::sliding_window(7, 0).unwrap(),
            GroupSpec::sliding_window(8, 3).unwrap(),
            GroupSpec::sliding_window(5, 9).unwrap(),
            GroupSpec::chunked(8).unwrap(),
            GroupSpec::chunked(6).unwrap(),
        ];
        let mut x = 7u64;
        for case in 0..4000 {
            let ng = 1 + (lcg(&mut x) % 3) as usize;
            let specs: Vec<GroupSpec> = (0..ng).map(|_| kinds[(lcg(&mut x) % kinds.len() as u64) as usize]).collect();
            let bs = [1usize, 2, 4][(lcg(&mut x) % 3) as usize];
            let n = (lcg(&mut x) % 24) as usize;
            // Dense holes early on, or only a few: both regimes.
            let miss = 1 + lcg(&mut x) % 8;
            let table: Vec<Vec<bool>> = (0..ng).map(|_| (0..n).map(|_| lcg(&mut x) % 10 >= miss.min(9)).collect()).collect();
            let cached = |g: usize, i: usize| table[g][i];
            let calls = Cell::new(0usize);
            let counted = |g: usize, i: usize| {
                calls.set(calls.get() + 1);
                cached(g, i)
            };
            let got = longest_hit(&specs, bs, n, counted);
            assert_eq!(got, brute(&specs, bs, n, &cached), "case {case}: {specs:?} bs {bs} table {table:?}");
            assert!(calls.get() <= ng * n, "memoized: at most one question per (group, block)");
        }
    }

    #[test]
    fn window_hit_needs_only_sinks_and_window() {
        // Window of 8 tokens, 4 sink tokens, blocks of 4: a hit of k blocks needs block 0
        // and blocks from (4k - 7) / 4 on.
        let s = [GroupSpec::sliding_window(8, 4).unwrap()];
        let present = [0usize, 7, 8, 9];
        let calls = Cell::new(0usize);
        let h = longest_hit(&s, 4, 10, |_, i| {
            calls.set(calls.get() + 1);
            present.contains(&i)
        });
        // Hit of 10 blocks (40 tokens): first needed 33 -> blocks 8, 9 + sink 0.
        assert_eq!(h, 10);
        assert_eq!(calls.get(), 3, "only the window and the sink block are looked up");
        // Block 8 gone: 9 blocks need 7 and 8 (first needed 29); 8 blocks need 6, 7 ... none
        // down to a hit of 1 block (positions 0..4, sink): valid with block 0.
        assert_eq!(longest_hit(&s, 4, 10, |_, i| [0usize, 7, 9].contains(&i)), 1);
        // Hybrid: a full group caps it at its leading run; the window group then needs
        // its window before that point.
        let hybrid = [GroupSpec::Full, GroupSpec::sliding_window(8, 0).unwrap()];
        let lead = 6;
        assert_eq!(longest_hit(&hybrid, 4, 10, |g, i| if g == 0 { i < lead } else { i >= 3 }), 6);
        assert_eq!(longest_hit(&hybrid, 4, 10, |g, i| if g == 0 { i < lead } else { i != 4 }), 4);
    }

    #[test]
    fn chunk_boundary_hits_need_nothing() {
        // A hit at a chunk boundary needs no block of the chunked group.
        let s = [GroupSpec::chunked(8).unwrap()];
        assert_eq!(longest_hit(&s, 4, 5, |_, _| false), 4);
        assert_eq!(longest_hit(&s, 4, 5, |_, i| i == 4), 5);
        assert_eq!(longest_hit(&[GroupSpec::Full], 4, 0, |_, _| true), 0);
    }
}
