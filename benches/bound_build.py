"""Builds a *bound build* of pykvpool into a directory, for ``benches/ab_decode.py``.

A bound build is compiled with the cargo feature ``bound-free-dots``: the AVX-512 integer
and f16 dot products of the opt-in paths (``q_dtype="int8"`` on int8 caches and
``q_dtype="f16", pv_dtype="f16"`` on fp8 ones: ``ab_decode.py``'s switches ``int8_scores``
and ``fp16_reduction``) and the shuffles that feed them become one xor per load, while every
load, prefetch, softmax step and accumulator flush stays. Its outputs are wrong; its
timing, paired against a normal build of the same commit, bounds what any cut of those
dot products could buy (``benches/RESULTS.md``, "Decode attention"). Only the rows that
take those paths change: the others run the same code in both builds and read about 1.000,
a check of the pairing.

Usage::

    maturin develop --release && cp -r pykvpool /tmp/A      # the normal build
    python benches/bound_build.py /tmp/free                   # the bound build
    python benches/ab_decode.py /tmp/A /tmp/free --shape full \\
        --rows bf16,int8+int8_scores,fp8_e5m2+fp16_reduction --interleave 100 \\
        --layers 16 --reallocate 25 --threads 1

Needs ``maturin`` on the PATH (``pip install maturin``). The build leaves the editable
install alone: it writes a wheel to a temporary directory and unpacks its ``pykvpool``
package into ``OUT/pykvpool`` (replaced if it exists).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(out: Path, maturin: str) -> Path:
    """Builds the bound wheel with the ``maturin`` executable at that path and unpacks its
    package into ``out / "pykvpool"``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [maturin, "build", "--release", "--features", "python,bound-free-dots", "--out", tmp]
        subprocess.run(cmd, cwd=ROOT, check=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"bound_build: error: expected one wheel, maturin wrote {len(wheels)}")
        pkg = out / "pykvpool"
        if pkg.exists():
            shutil.rmtree(pkg)
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(out, [m for m in z.namelist() if m.startswith("pykvpool/")])
    return pkg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory to hold the bound build's pykvpool package")
    args = ap.parse_args()
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"out: {args.out} is not a directory")
    maturin = shutil.which("maturin")
    if maturin is None:
        ap.error("maturin is not on the PATH (pip install maturin)")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"bound build (wrong outputs, timing only): {build(args.out, maturin)}")


if __name__ == "__main__":
    main()
