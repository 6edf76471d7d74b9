#!/usr/bin/env bash
# The test command of the README and of CI: builds everything from scratch in .venv and
# runs every test (Rust unit and property tests, clippy, rustdoc's links, the aarch64/NEON tests under
# qemu, Python tests (report.html in Debian's headless chromium among them), stub check, and the
# wheel installed in a fresh venv running the main job).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# Editable install: pip runs maturin (the build backend) and builds the extension in release.
# With the torch and transformers extras, so tests/attention/test_torch.py and tests/hf/test_hf.py run (they
# skip without them). PyPI's torch wheel pulls its CUDA runtime wheels (~5.6 GB installed;
# about 3 minutes on a fresh venv without a pip cache, measured): CPU-only torch wheels live
# only on download.pytorch.org, and the PyPI wheel does not import without those libraries.
# With the ray extra, tests/search/test_search_backends.py starts and stops its own local Ray.
python -m pip install --quiet -e '.[test,torch,hf,ray]'

cargo test --locked --quiet
cargo clippy --locked --quiet --all-targets --features python -- -D warnings
# The developers' docs (private items included) build without a warning: a broken link fails.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps --document-private-items --features python
RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps --document-private-items
# Debian's chromium for the report.html browser tests (PYKVPOOL_SKIP_BROWSER=1 skips them,
# loudly): installed now, as tests/aarch64.sh below may run apt-get too and two at once
# collide on dpkg's lock.
bash tests/browser.sh
# The aarch64 build and NEON kernel under qemu (PYKVPOOL_SKIP_AARCH64=1 skips it, loudly),
# beside pytest, at the lowest priority: pytest mostly runs on one core and leaves the
# other idle (on a 2-core host the two in a row took 19 of CI's 30 minutes), and `nice`
# keeps the cross build off the core pytest needs. Its output follows pytest's.
aarch64_log=$(mktemp)
nice -n 19 bash tests/aarch64.sh >"$aarch64_log" 2>&1 &
aarch64_pid=$!
trap 'kill "$aarch64_pid" 2>/dev/null || true; rm -f "$aarch64_log"' EXIT

# pytest exits 5 when it collects no test: that fails the run too.
pytest_rc=0
python -m pytest -q "$@" || pytest_rc=$?
# The wheel: built, installed in a fresh venv, the main job run from it without cargo.
wheel_rc=0
bash tests/wheel_smoke.sh || wheel_rc=$?
aarch64_rc=0
wait "$aarch64_pid" || aarch64_rc=$?
echo "--- tests/aarch64.sh (ran beside pytest) ---"
cat "$aarch64_log"
if ((pytest_rc != 0 || wheel_rc != 0 || aarch64_rc != 0)); then
    echo "tests/run.sh: failed (pytest exit $pytest_rc, tests/wheel_smoke.sh exit $wheel_rc, tests/aarch64.sh exit $aarch64_rc)" >&2
    exit 1
fi
