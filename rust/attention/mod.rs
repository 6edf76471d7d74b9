//! Paged decode attention: one query token per sequence against its cached K/V.
//!
//! `out[s, hq] = softmax(scale * q[s, hq] . K[s, hkv]^T) V[s, hkv]` with
//! `hkv = hq / g`, `g = Hq / Hkv` (GQA), K/V read through the sequence's block table.
//!
//! # How the work is cut
//!
//! A *work item* is (sequence, group of KV heads, run of whole blocks). Each item reads
//! every K/V byte of its range once for all `g` query heads of each KV head, keeps an
//! online softmax (running max `m`, sum `l`, unnormalised `acc`, all f32) and writes a
//! partial result. Sequences longer than a quarter of a thread's share of the batch are
//! split along their blocks (FlashDecoding: one long sequence still uses every core, and
//! uneven lengths balance); an item alone in its (sequence, head group) accumulates in the
//! output itself, split ones are merged by log-sum-exp (`partials`). Items run on the
//! [`crate::runtime::threads`] rayon pool.
//!
//! Queries are pre-multiplied by `scale * log2(e)` so the kernels use `exp2`; `m` is
//! therefore in log2 units and the returned LSE is converted back to natural log.
//! A logit soft cap (Gemma-2) maps each finished score `s` to `c * tanh(s / c)` before
//! the softmax, `c` the cap in log2 units, on every path (`work::soft_cap`; the SIMD paths
//! compute it with their `exp2`, as a const-generic instantiation of their tile loop so
//! that calls without a cap run the loop they had before).
//!
//! # Instruction sets
//!
//! [`scalar`] is the portable reference; AVX-512 (F/BW/VL) and AVX2 (+ FMA + F16C) on x86-64, NEON (Advanced SIMD) on aarch64, are chosen at run time
//! by [`Isa::best`], or forced per call (a path of the other architecture is reported as
//! unsupported). With the opt-in bf16 query (`Precision { q: BF16, .. }`, bf16 and fp8
//! caches), the AVX-512 path computes the scores with `vdpbf16ps` ([`avx512_bf16`]) when
//! the CPU has avx512_bf16 (fp8: and avx512vbmi, for the byte tables that widen the codes
//! to bf16); every path then uses the bf16-rounded query, so the precision means the same
//! math everywhere. Likewise an int8 query (`Precision { q: I8, .. }`, int8 caches): the
//! query quantized to int8 per row, scores by `vpdpbusd` ([`avx512_vnni`]) on AVX-512
//! with avx512_vnni, by f32 FMAs on the dequantized quantized query on every other path. e4m3 caches of block size 16 (head_dim a
//! multiple of 64) take byte tables instead of the f16 route on AVX-512 with avx512vbmi
//! (`avx512_e4m3`: the same values, the exact path's math). The NEON path is tested under qemu (`tests/aarch64.sh`), for correctness
//! only: no aarch64 hardware timed it.
//!
//! # Bound builds
//!
//! With the cargo feature `bound-free-dots` ([`work::FREE_DOTS`]) the `vpdpbusd` and
//! `vfmadd231ph` dot products of the opt-in AVX-512 paths (and the shuffles that feed
//! them) become one xor per load: every load, prefetch, softmax and accumulator flush
//! stays, the outputs are wrong. A paired A/B of such a build against a normal one
//! (`benches/bound_build.py`) bounds what any cut of those dot products could buy.
//!
//! # Files
//!
//! [`isa`] (the paths and the CPU check), [`work`] (what every path reads and writes),
//! `lanes` (one instruction set's vector, which the shared loops are written over:
//! `simd` for decode, `prefill::simd`), the AVX-512 precisions' files,
//! [`tables`] (the block tables a call reads), `route` (the one selection of what a call
//! runs, decode and prefill), [`decode`] (plan, run) and `partials` (the items'
//! accumulators, the merge). The paths depend on `work` only; `decode` depends on the
//! paths; the decode and prefill tests share `test_util`. A new path is a `Lanes`
//! implementation, a variant of [`Isa`] and an arm of the dispatch (ARCHITECTURE.md lists
//! the files).

// The docs here link the x86-64 paths by name; other targets do not compile them (`cargo
// doc` for x86-64, which CI runs with `-D warnings`, checks those links).
#![cfg_attr(not(target_arch = "x86_64"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(target_arch = "x86_64")]
mod avx2_cvt;
#[cfg(target_arch = "x86_64")]
pub mod avx512_bf16;
#[cfg(target_arch = "x86_64")]
mod avx512_cvt;
#[cfg(target_arch = "x86_64")]
mod avx512_e4m3;
#[cfg(target_arch = "x86_64")]
mod avx512_fp16;
#[cfg(target_arch = "x86_64")]
pub mod avx512_vnni;
pub mod decode;
pub mod isa;
mod lanes;
pub mod options;
mod prefetch;
mod partials;
pub mod read_probe;
pub mod prefill;
mod query;
mod route;
#[cfg(target_arch = "aarch64")]
mod neon_cvt;
pub mod scalar;
mod simd;
pub mod tables;
mod tile_kernels;
pub mod work;
mod wide;

pub use decode::{decode_attention, DecodeOptions};
pub use isa::{cpu_features, Features, Isa};
pub use options::{Kernel, Precision, Tuning};
pub use tables::SeqTables;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_fp8;
#[cfg(test)]
mod tests_int8;
#[cfg(test)]
mod tests_q8;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_fp16;
#[cfg(test)]
mod tests_window;
