//! The one selection of what a call runs: [`Route::select`] takes the kernel (decode or
//! prefill), the path, the CPU's features as a value, the cache's dtype, the precision and
//! the shape, once per call. Only `select` makes a [`Route`] (its fields are private), so
//! holding one proves the feature checks the `unsafe` calls of its kernels rely on.

use super::isa::{Features, Isa, Supported};
use super::options::{Kernel, Precision};
use crate::kv::{DType, KvShape};

/// What a call's work items run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    path: Supported,
    kernel: Kernel512,
    /// The features the route was chosen with (for decode's NaN-code rerun, x86-64 only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    features: Features,
}

/// The AVX-512 path's kernels beyond its own tile loop (`Plain` elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel512 {
    Plain,
    /// `vdpbf16ps`: decode's scores of a bf16 query on a bf16 cache, or on fp8 with
    /// avx512vbmi; prefill's scores and `P V` on a bf16 cache.
    Bf16Dot,
    /// `vpdpbusd` scores: an int8 query on an int8 cache (decode).
    Int8Dot,
    /// f16 scores and `P V` (decode; fp8, block size 16, head_dim a multiple of 64) where
    /// an item's scales allow it, else `Tables` (`tables`) or `Plain`.
    F16 { tables: bool },
    /// e4m3 widened by byte tables (decode; block size 16, head_dim a multiple of 64,
    /// avx512vbmi).
    Tables,
}

impl Route {
    /// The one selection: what `kernel` runs on `path` with `features` (a subset of this
    /// CPU's) for a cache of `kv` and `shape` at `precision`.
    pub(crate) fn select(kernel: Kernel, path: Supported, features: Features, kv: DType, precision: Precision, shape: KvShape) -> Self {
        let has = |f: &str| features.has(f);
        let avx512 = path.isa() == Isa::Avx512;
        let fp8 = matches!(kv, DType::E4M3 | DType::E5M2);
        let kernel = match kernel {
            // Prefill packs bf16 tiles for `vdpbf16ps` whatever the precision asks of it.
            Kernel::Prefill if avx512 && kv == DType::BF16 && has("avx512bf16") => Kernel512::Bf16Dot,
            Kernel::Prefill => Kernel512::Plain,
            Kernel::Decode => {
                let tables = kv == DType::E4M3 && has("avx512vbmi") && tables_fit(shape);
                match precision.q {
                    DType::BF16 if avx512 && has("avx512bf16") && (kv == DType::BF16 || fp8 && has("avx512vbmi")) => Kernel512::Bf16Dot,
                    DType::I8 if avx512 && has("avx512vnni") => Kernel512::Int8Dot,
                    DType::F16 if avx512 && fp8 && has("avx512fp16") && tables_fit(shape) => Kernel512::F16 { tables },
                    _ if avx512 && tables => Kernel512::Tables,
                    _ => Kernel512::Plain,
                }
            }
        };
        Route { path, kernel, features }
    }

    pub(crate) fn path(self) -> Supported {
        self.path
    }

    pub(crate) fn kernel(self) -> Kernel512 {
        self.kernel
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn features(self) -> Features {
        self.features
    }
}

/// The shape the AVX-512 byte-table and f16 kernels take: block size 16, head_dim a
/// multiple of 64 (4 rows of 16 tokens are 64 adjacent codes).
fn tables_fit(shape: KvShape) -> bool {
    shape.block_size == 16 && shape.head_dim.is_multiple_of(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(block_size: usize, head_dim: usize) -> KvShape {
        KvShape { num_layers: 1, num_blocks: 4, block_size, num_kv_heads: 1, head_dim }
    }

    fn pair(q: DType, pv: DType) -> Precision {
        Precision { q, pv }
    }

    /// Each kernel is chosen exactly where its feature, dtype, precision and shape allow,
    /// and a set without the feature falls back as a CPU without it would.
    #[test]
    fn the_route_follows_the_features_it_is_given() {
        let cpu = Features::cpu();
        let Some(avx512) = Supported::check(Isa::Avx512, cpu) else {
            eprintln!("SKIPPED the AVX-512 routes: this CPU lacks AVX-512");
            return;
        };
        let kernel = |f: Features, kv, p, s| Route::select(Kernel::Decode, avx512, f, kv, p, s).kernel();
        let (exact, bf16, int8, f16) = (Precision::EXACT, pair(DType::BF16, DType::F32), pair(DType::I8, DType::F32), pair(DType::F16, DType::F16));
        let (tiles, odd) = (shape(16, 128), shape(8, 65));
        let none = cpu.without(&["avx512bf16", "avx512vnni", "avx512vbmi", "avx512fp16"]);
        for s in [tiles, odd] {
            for (kv, p) in [(DType::BF16, bf16), (DType::E5M2, bf16), (DType::I8, int8), (DType::E5M2, f16), (DType::E4M3, exact)] {
                assert_eq!(kernel(none, kv, p, s), Kernel512::Plain, "{kv:?} {p:?} {s:?}");
            }
        }
        let has = |f: &str| cpu.has(f);
        let expect = |on: bool, k| if on { k } else { Kernel512::Plain };
        assert_eq!(kernel(cpu, DType::BF16, bf16, odd), expect(has("avx512bf16"), Kernel512::Bf16Dot));
        assert_eq!(kernel(cpu, DType::E5M2, bf16, odd), expect(has("avx512bf16") && has("avx512vbmi"), Kernel512::Bf16Dot));
        assert_eq!(kernel(cpu.without(&["avx512vbmi"]), DType::E5M2, bf16, odd), Kernel512::Plain);
        assert_eq!(kernel(cpu, DType::I8, int8, odd), expect(has("avx512vnni"), Kernel512::Int8Dot));
        assert_eq!(kernel(cpu, DType::I8, exact, tiles), Kernel512::Plain);
        assert_eq!(kernel(cpu, DType::E4M3, exact, tiles), expect(has("avx512vbmi"), Kernel512::Tables));
        assert_eq!(kernel(cpu, DType::E4M3, exact, odd), Kernel512::Plain);
        assert_eq!(kernel(cpu, DType::E5M2, exact, tiles), Kernel512::Plain);
        let tables = has("avx512vbmi");
        assert_eq!(kernel(cpu, DType::E4M3, f16, tiles), if has("avx512fp16") { Kernel512::F16 { tables } } else { expect(tables, Kernel512::Tables) });
        assert_eq!(kernel(cpu, DType::E4M3, f16, odd), Kernel512::Plain);
        // Prefill: `vdpbf16ps` tiles on a bf16 cache, whatever the precision; nothing else.
        let prefill = |f: Features, kv| Route::select(Kernel::Prefill, avx512, f, kv, exact, tiles).kernel();
        assert_eq!(prefill(cpu, DType::BF16), expect(has("avx512bf16"), Kernel512::Bf16Dot));
        assert_eq!(prefill(cpu.without(&["avx512bf16"]), DType::BF16), Kernel512::Plain);
        assert_eq!(prefill(cpu, DType::E4M3), Kernel512::Plain);
        // The other paths have no kernels of their own.
        for isa in [Isa::Scalar, Isa::Avx2] {
            let path = Supported::check(isa, cpu).expect("an AVX-512 CPU runs AVX2 and scalar");
            assert_eq!(Route::select(Kernel::Decode, path, cpu, DType::BF16, bf16, odd).kernel(), Kernel512::Plain);
        }
    }
}
