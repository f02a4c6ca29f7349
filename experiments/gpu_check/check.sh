#!/bin/bash
# The cuda device's checks on a GPU machine, from what prepare.sh made: the GPU tests,
# every zoo model's outputs against numpy, profiles, and live replays. Each step has its
# own time limit and the script goes on past a failed one (but the smoke test); all it
# prints is also in RESULTS/log.txt, and the replays keep their reports (with the
# controller's and worker's output) in RESULTS/replay-*.
#
#   bash experiments/gpu_check/check.sh DIR RESULTS [quick]
#
# quick: the smoke test, the GPU tests and one live replay (about 1.5 minutes with an empty
# kernel cache); the full run also checks outputs, profiles every model into
# RESULTS/profiles/ and replays twice (on an H200: 4.5 minutes with an empty kernel cache, 3
# with a full one).
set -u
dir=$(cd "${1:?usage: check.sh DIR RESULTS [quick]}" && pwd)
mkdir -p "${2:?usage: check.sh DIR RESULTS [quick]}"
res=$(cd "$2" && pwd)
quick=${3:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/experiments/gpu_check"
cd "$root"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$res/log.txt") 2>&1
t0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }

step start
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
site=/tmp/clockwork-gpu-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$dir"/whl/*.whl || exit 1
cp -r "$dir/rt/tvm" "$site/"
export PYTHONPATH="$site:$root" TVM_USE_RUNTIME_LIB=1
export CLOCKWORK_KERNEL_CACHE=${CLOCKWORK_KERNEL_CACHE:-$res/kernels}
python3 -c "import sys, numpy, grpc, cupy, tvm; print('python', sys.version.split()[0], \
'numpy', numpy.__version__, 'grpc', grpc.__version__, 'cupy', cupy.__version__, 'tvm', \
tvm.__version__)"
pk="$res/packages"
rm -rf "$pk" && mkdir -p "$pk" && tar xzf "$dir/packages.tgz" -C "$pk" --strip-components=1
python3 "$here/weights.py" "$pk"/* | tail -1

step smoke
timeout 300 python3 "$here/smoke.py" "$pk/mlp" || { step "smoke failed: stopping"; exit 1; }

step "GPU tests"
CLOCKWORK_TEST_CUDA_PACKAGES="$dir/testpk" timeout 300 python3 -m pytest -p no:cacheprovider \
  -q -rs -k "not cpu" tests/test_cuda_device.py tests/test_cuda_streams.py \
  tests/test_cuda_kernels.py tests/test_device_conformance.py 2>&1 | tail -25

# an array, not a function: timeout runs programs, and a shell function is none
cli=(python3 -m clockwork.cluster.cli)
if [ -z "$quick" ]; then
  step "outputs against numpy"
  timeout 300 python3 experiments/check_outputs.py --device cuda --packages "$pk"
  step profiles
  mkdir -p "$res/profiles"
  for m in mlp resnet_tiny mobilenet_tiny transformer_tiny resnet18; do
    timeout 200 "${cli[@]}" profile "$m" --device cuda --package "$pk/$m" --out "$res/profiles/$m.json"
  done
fi

# the live replays use the shipped cuda profile set (or, after the step above, the new one)
profiles=cuda
[ -f "$res/profiles/resnet18.json" ] && cp "$(python3 -c 'import clockwork, os; print(os.path.dirname(clockwork.__file__))')/data/profiles/cuda/set.json" "$res/profiles/" && profiles="$res/profiles"
step "live replay: 38 instances vs an 8-page cache, 1,000 r/s"
timeout 300 "${cli[@]}" serve "$here/cuda_live.toml" --device cuda --packages "$pk" --replay --quiet \
  --set "cluster.profiles=$profiles" --out "$res/replay-cold"
if [ -z "$quick" ]; then
  step "live replay: every instance cached, 3,000 r/s"
  timeout 120 "${cli[@]}" serve "$here/cuda_live.toml" --device cuda --packages "$pk" --replay --quiet \
    --set "cluster.profiles=$profiles" --set cluster.weights_cache_pages=64 \
    --set workloads.0.rate_rps=3000 --out "$res/replay-warm"
fi
step end
