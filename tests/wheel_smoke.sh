#!/usr/bin/env bash
# The wheel a user installs: built by maturin (release, the locked dependencies), installed
# into a fresh venv, then the main job run from it with no Rust toolchain on the PATH and
# outside the source tree, so nothing but the wheel can be imported. Called by tests/run.sh
# inside its venv (for maturin); prints one closing line.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip install --quiet "maturin>=1.9.4,<2"
maturin build --release --locked --quiet --out "$work/dist"
python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "$work"/dist/pykvpool-*.whl

clean_path="$work/venv/bin:/usr/local/bin:/usr/bin:/bin"
cd "$work"
if PATH="$clean_path" command -v cargo >/dev/null; then
    echo "tests/wheel_smoke.sh: cargo is still on the smoke test's PATH" >&2
    exit 1
fi
PATH="$clean_path" python -c "import pykvpool, sys; sys.exit(pykvpool.__file__.startswith('$work') is False)"
PATH="$clean_path" pykvpool report --no-measure --no-search --quiet --out report >/dev/null
test -s report/report.md
echo "wheel smoke: $(ls dist) installed in a fresh venv, pykvpool report wrote report/report.md"
