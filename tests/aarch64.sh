#!/usr/bin/env bash
# The aarch64 build and its NEON kernel path, cross-compiled and run under qemu-aarch64
# user-mode emulation: clippy -D warnings for the target (library, tests and benches) and its rustdoc, then every Rust unit test of
# the library (the kernel's paths against an f64 reference among them). Correctness
# only: emulated timing says nothing about hardware. Called by tests/run.sh.
#
# Needs the rustup target aarch64-unknown-linux-gnu, a cross linker with the target's libc
# (Debian: gcc-aarch64-linux-gnu) and qemu-aarch64 (Debian: qemu-user); whatever is
# missing is installed (rustup; apt-get when running as root), otherwise the script fails
# and says what to install. PYKVPOOL_SKIP_AARCH64=1 skips it, loudly.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

if [[ "${PYKVPOOL_SKIP_AARCH64:-0}" == 1 ]]; then
    echo "!!! PYKVPOOL_SKIP_AARCH64=1: the aarch64 build and NEON kernel tests were NOT run !!!" >&2
    exit 0
fi

fail() {
    echo "tests/aarch64.sh: $*" >&2
    echo "tests/aarch64.sh: set PYKVPOOL_SKIP_AARCH64=1 to skip the aarch64 tests knowingly" >&2
    exit 1
}

missing=()
command -v aarch64-linux-gnu-gcc >/dev/null && [[ -d $SYSROOT/lib ]] || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "tests/aarch64.sh: installing ${missing[*]}" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null ||
            fail "apt-get install ${missing[*]} failed"
    else
        fail "missing ${missing[*]}; install with: sudo apt-get install ${missing[*]}"
    fi
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    command -v rustup >/dev/null || fail "rustup not found: cannot add the $TARGET standard library"
    rustup target add "$TARGET" >/dev/null || fail "rustup target add $TARGET failed"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"

cargo clippy --locked --quiet --target "$TARGET" --all-targets -- -D warnings
# The developers' docs for the target: its own links (NEON's among them) resolve.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --target "$TARGET" --no-deps --document-private-items

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The `qemu` profile: optimised code, debug assertions and overflow checks on (Cargo.toml).
cargo test --locked --quiet --target "$TARGET" --profile qemu --lib -- --format pretty 2>&1 | tee "$log"

# A run that never reached the NEON path (feature not detected, test filtered out or
# renamed) must fail, not pass with the scalar path alone.
neon_check="test attention::tests::neon_is_the_best_path_on_aarch64_only ... ok"
grep -qxF "$neon_check" "$log" || fail "'$neon_check' missing: the NEON path was not exercised"
# The prefill kernel's NEON micro-kernels run in these (every available path is compared).
prefill_check="test attention::prefill::tests::all_paths_match_reference_over_masks_shapes_and_dtypes ... ok"
grep -qxF "$prefill_check" "$log" || fail "'$prefill_check' missing: the NEON prefill path was not exercised"
passed=$(grep -cE '^test attention::.* \.\.\. ok$' "$log" || true)
((passed >= 10)) || fail "only $passed kernel tests passed under qemu"
echo "tests/aarch64.sh: $passed kernel tests passed on $TARGET under qemu, NEON path included"
