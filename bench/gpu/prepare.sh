#!/usr/bin/env bash
# Build, on a machine that reaches PyPI, the Ray runtime that bench/gpu/run_all.sh unpacks on the GPU machine
# (docs/gpu.md). The GPU machine's image has Python 3.12 with CUDA PyTorch, numpy, pyarrow, pyyaml, ... but no Ray
# and no network, and at most 64 MiB of the working tree travels there: Ray's wheel (79 MB) does not fit, so it is
# unpacked here without the libraries fedray never imports and packed as one tar.xz of a site directory, with
# the few pure-Python (and one compiled) dependencies of Ray that the image lacks.
#
#   bash bench/gpu/prepare.sh                    # -> bench/gpu/.runtime/ray-cp312.tar.xz (ignored by git)
#   PYVER=3.11 bash bench/gpu/prepare.sh         # the same for CPython 3.11 (-> ray-cp311.tar.xz): the pruned
#                                                #    tree tested here with this machine's Python (--check)
#   bash bench/gpu/prepare.sh --check            # also unpack it and, when a python$PYVER is here, start Ray
#                                                #    and an actor with only the pruned tree (bench/gpu/check_runtime.py)
#
# Ray's version is the venv's (pyproject pins ray[default]==2.60.0); the dependency versions are the venv's too.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
PYVER="${PYVER:-3.12}"
TAG="cp${PYVER/./}"
OUTDIR="${OUTDIR:-$HERE/.runtime}"
TARBALL="$OUTDIR/ray-$TAG.tar.xz"
CHECK=0
[[ "${1:-}" == "--check" ]] && CHECK=1

version_of() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
RAY_VERSION="$(version_of ray)"
[[ -n "$RAY_VERSION" ]] || { echo "prepare.sh: no ray in $PY's environment" >&2; exit 1; }

# Ray's Requires-Dist (unzip -p ray-*.whl '*/METADATA'): click, filelock, jsonschema, msgpack, packaging, protobuf,
# pyyaml, requests and, for the raylet's agents, aiohttp with its own (aiohappyeyeballs, aiosignal, attrs,
# frozenlist, multidict, propcache, yarl, idna). The GPU image has every one of them but jsonschema, whose own
# needs are jsonschema-specifications, referencing, rpds-py (compiled: the cp3XX manylinux wheel) and attrs (there).
# Every Ray worker imports jsonschema at start (ray._private.runtime_env validation), so an actor needs them.
DEPS=(jsonschema jsonschema-specifications referencing rpds-py)

# The parts of the wheel a driver, the GCS, the raylet, its agents and actors never import (fedray uses ray core:
# ray.init, actors, the object store, ray.util.scheduling_strategies). ray/jars is the Java worker (34 MB), the
# dashboard's client/build the web UI (include_dashboard=False in fedray's local Ray).
PRUNE=(ray/jars ray/rllib ray/serve ray/llm ray/data ray/train ray/tune ray/air ray/workflow
       ray/dashboard/client/build)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fedray-gpu-runtime.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/wheels" "$WORK/site" "$OUTDIR"

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pinned=("ray==$RAY_VERSION")
for d in "${DEPS[@]}"; do
  v="$(version_of "$d")"
  pinned+=("$d${v:+==$v}")
done
echo "prepare.sh: downloading ${pinned[*]} for CPython $PYVER manylinux x86_64"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$WORK/wheels" "${pinned[@]}"
ls -l "$WORK/wheels"

for whl in "$WORK/wheels"/*.whl; do
  excludes=()
  if [[ "$(basename "$whl")" == ray-* ]]; then
    for p in "${PRUNE[@]}"; do excludes+=("$p/*"); done
  fi
  unzip -q -o "$whl" -d "$WORK/site" ${excludes[@]+-x "${excludes[@]}"}
done
# the wheel's RECORD lists the pruned files: drop it so no tool trusts it; bytecode is made on the device
rm -f "$WORK"/site/ray-*.dist-info/RECORD
find "$WORK/site" -name '__pycache__' -type d -prune -exec rm -rf {} +

# what the device needs, present: the raylet extension, the GCS and raylet binaries, the dependencies
raylet_so="$(ls "$WORK"/site/ray/_raylet*.so)"
for need in "$raylet_so" "$WORK/site/ray/core/src/ray/gcs/gcs_server" "$WORK/site/ray/core/src/ray/raylet/raylet" \
            "$WORK/site/jsonschema/__init__.py" "$WORK/site/referencing/__init__.py" \
            "$WORK/site/jsonschema_specifications/__init__.py"; do
  [[ -e "$need" ]] || { echo "prepare.sh: missing $need" >&2; exit 1; }
done
ls "$WORK"/site/rpds/*.cpython-"${TAG#cp}"-x86_64-linux-gnu.so >/dev/null \
  || { echo "prepare.sh: no rpds extension for $TAG" >&2; exit 1; }
for p in "${PRUNE[@]}"; do [[ ! -e "$WORK/site/$p" ]] || { echo "prepare.sh: $p not pruned" >&2; exit 1; }; done
echo "prepare.sh: site directory $(du -sh "$WORK/site" | cut -f1) unpacked"

echo "ray $RAY_VERSION $TAG; ${pinned[*]}; pruned: ${PRUNE[*]}" > "$WORK/site/FEDRAY_RUNTIME.txt"
XZ_OPT="${XZ_OPT:--6 -T2}" tar -C "$WORK/site" -cJf "$TARBALL.tmp" .
mv "$TARBALL.tmp" "$TARBALL"
size=$(stat -c %s "$TARBALL")
echo "prepare.sh: $TARBALL: $(( size / 1048576 )) MiB ($size bytes)"

# what would travel with it: the tracked and untracked-not-ignored files of the repository, and this tarball
tree_bytes=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
             | awk '{s+=$1} END {print s+0}')
total=$(( tree_bytes + size ))
echo "prepare.sh: working tree $(( tree_bytes / 1048576 )) MiB + tarball = $(( total / 1048576 )) MiB of the 64 MiB that may travel"
if (( total > 64 * 1048576 )); then
  echo "prepare.sh: over 64 MiB: the device call would be refused" >&2
  exit 1
fi

if (( CHECK )); then
  dest="$WORK/check-site"
  mkdir -p "$dest"
  tar -C "$dest" -xJf "$TARBALL"
  if command -v "python$PYVER" >/dev/null 2>&1 || [[ -x "${CHECK_PYTHON:-}" ]]; then
    cpy="${CHECK_PYTHON:-python$PYVER}"
    echo "prepare.sh: starting Ray from the unpacked tree with $cpy"
    "$cpy" "$HERE/check_runtime.py" "$dest"
  else
    echo "prepare.sh: no python$PYVER here: checked the tarball's contents only (set CHECK_PYTHON to test one)"
  fi
fi
