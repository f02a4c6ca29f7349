#!/bin/bash
# Prepare, on a machine with this project's environment (.venv with the test extra, so
# TVM's compiler) and network access, what check.sh needs on a GPU machine that has
# neither: packages cross-compiled for CUDA, TVM's runtime alone, and wheels for the
# GPU machine's Python. No GPU is needed here.
#
#   bash experiments/gpu_check/prepare.sh DIR [PYTHON_VERSION]    # default 3.12
#
# DIR ends up at about 35 MB: packages.tgz (the five zoo models, weights left out: check.sh
# writes them again from their seeds), testpk/ (the GPU tests' packages), rt/tvm (TVM
# without its 260 MB compiler library) and whl/ (what the GPU machine's Python may lack).
set -euo pipefail
out=${1:?usage: prepare.sh DIR [PYTHON_VERSION]}
pyver=${2:-3.12}
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"

echo "prepare: zoo packages for cuda (sm_90, a cross-compile)"
rm -rf "$out/pk"
for m in mlp resnet_tiny mobilenet_tiny transformer_tiny resnet18; do
  "$py" -m clockwork.cluster.cli compile "$m" --device cuda --out "$out/pk/$m" 2>&1 | tail -1
done
(cd "$out" && tar czf packages.tgz --exclude=weights.bin pk && rm -rf pk)

echo "prepare: the GPU tests' packages"
rm -rf "$out/testpk"
env -u CLOCKWORK_TEST_CUDA_PACKAGES "$py" -m tests.cuda_packages "$out/testpk"

echo "prepare: TVM's runtime without its compiler"
site=$("$py" -c "import os, tvm; print(os.path.dirname(os.path.dirname(tvm.__file__)))")
rm -rf "$out/rt" && mkdir -p "$out/rt"
cp -r "$site/tvm" "$out/rt/"
rm -rf "$out/rt/tvm/3rdparty" "$out/rt/tvm/src" "$out/rt/tvm/web" "$out/rt/tvm/lib/libtvm_compiler.so"
find "$out/rt" -name __pycache__ -prune -exec rm -rf {} +

echo "prepare: wheels for Python $pyver"
pins=$("$py" - <<'EOF'
from importlib.metadata import version
names = ["apache-tvm-ffi", "orjson", "pydantic", "pydantic-core", "annotated-types",
         "typing-inspection", "typing-extensions", "grpcio", "protobuf"]
print(" ".join(f"{n}=={version(n)}" for n in names))
EOF
)
rm -rf "$out/whl"
# shellcheck disable=SC2086
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$out/whl" $pins
du -sh "$out"
