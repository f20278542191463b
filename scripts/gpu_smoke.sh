#!/usr/bin/env bash
# The CUDA/NCCL paths on a real GPU machine, through the localhost transport (no sshd):
# doctor's GPU facts, a GPU-count mismatch, a process already holding GPU memory, an NCCL
# all-reduce under `sshddp launch` (and the collectives its exit record counts), an NCCL
# world that never runs a collective reported "not distributed", a failing NCCL rank (its
# traceback without sshddp's frames) torn down with its GPU freed, a
# collective that never completes found by the stall watchdog with the NCCL flight
# recorder's dump, `sshddp stacks --native` of a detached NCCL rank (py-spy, if there), and
# `sshddp top` of that run: its GPUs sampled through NVML, compared with nvidia-smi;
# `doctor --health` on healthy GPUs and what a launch's GPU health subset (nvidia-smi -q) costs.
# Usage: bash scripts/gpu_smoke.sh [OUT_DIR]   (needs torch with CUDA and sshddp importable)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-${OUT:-/tmp/gpu-smoke}}
mkdir -p "$out"
py=$(command -v python3)
sshddp() { "$py" -m sshddp "$@"; }
step() { printf '\n==> %s\n' "$*"; }
ngpu=$(nvidia-smi -L | wc -l)

inv() {  # inv FILE GPUS
    printf 'rendezvous: {port: 29531}\nhosts:\n  - host: localhost\n    gpus: %s\n    python: %s\n' \
        "$2" "$py" >"$1"
}
inv "$out/gpu.yaml" "$ngpu"
inv "$out/too-many.yaml" $((ngpu + 1))

step "nvidia-smi"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "doctor ($ngpu GPU)"; sshddp doctor "$out/gpu.yaml"; echo "exit $?"
sshddp doctor --json "$out/gpu.yaml" >"$out/doctor.json"; echo "json exit $?"
step "doctor, inventory claims $((ngpu + 1)) GPUs"; sshddp doctor "$out/too-many.yaml"; echo "exit $?"
step "doctor --health on healthy GPUs (expect gpu_health ok, xid ok or a note; exit 0), and its time"
time sshddp doctor --health "$out/gpu.yaml"; echo "exit $?"
step "what a launch's GPU health subset costs: nvidia-smi -q, 3 times (it runs beside the probe's import of torch)"
for _ in 1 2 3; do /usr/bin/time -f "nvidia-smi -q: %e s" nvidia-smi -q >/dev/null; done

step "doctor while another process holds GPU memory"
"$py" -c 'import torch,time; x=torch.empty(2**30, device="cuda"); print("holding", flush=True); time.sleep(120)' &
holder=$!
sleep 12
sshddp doctor "$out/gpu.yaml"; echo "exit $?"
kill "$holder"; wait "$holder" 2>/dev/null

step "launch: NCCL all-reduce"
sshddp launch --log-dir "$out/logs" --name nccl-ok "$out/gpu.yaml" scripts/payloads/nccl_smoke.py 'a b' '$(x)'
echo "exit $?"

step "the NCCL run's exit record: its rank joined a world of 1 and ran collectives (NCCL's sequence number, read by the ranks' site hook)"
python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["world"])' ~/.sshddp/runs/nccl-ok/n0/exit.json

step "launch: 2 ranks form an NCCL world and never run a collective (expect exit 0 and the 'not distributed' warning)"
sshddp launch --log-dir "$out/logs" --name nccl-alone --nproc-per-node 2 "$out/gpu.yaml" \
    scripts/payloads/nccl_smoke.py --alone
echo "exit $?"
python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["world"])' ~/.sshddp/runs/nccl-alone/n0/exit.json

step "launch: an NCCL rank fails while holding GPU memory"
sshddp launch --log-dir "$out/logs" --name nccl-fail "$out/gpu.yaml" scripts/payloads/nccl_smoke.py --fail
echo "exit $?"
sleep 1
step "GPU processes left after the teardown (expect none)"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
echo "count: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"

step "launch: a collective that never completes, --stall-timeout 6 (expect exit 6 and the flight recorder's finding)"
start=$(date +%s%N)
sshddp launch --log-dir "$out/logs" --name nccl-stall --stall-timeout 6 "$out/gpu.yaml" \
    scripts/payloads/nccl_smoke.py --hang
echo "exit $? after $(( ($(date +%s%N) - start) / 1000000 )) ms"
cp ~/.sshddp/runs/nccl-stall/n0/nccl/trace_0 ~/.sshddp/runs/nccl-stall/n0/hang.json "$out/"
ls -la ~/.sshddp/runs/nccl-stall/n0/nccl/
sleep 1
step "GPU processes left after the stall's stop (expect none)"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
echo "count: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"

step "stacks --native of a detached NCCL rank waiting on its GPU (py-spy: C and CUDA frames)"
sshddp launch --log-dir "$out/logs" --name nccl-native --detach "$out/gpu.yaml" \
    scripts/payloads/nccl_smoke.py --hang
echo "exit $?"
sleep 8
if command -v py-spy >/dev/null; then
    sshddp stacks nccl-native --native; echo "exit $?"
else
    echo "py-spy is not installed here: skipping --native"
fi
sshddp stacks nccl-native; echo "exit $?"

step "top of the detached NCCL run: the node's GPUs read through NVML (expect gpu_source nvml, a GPU row with its model, memory used/total, power and temperature; the rank's GPU memory)"
sleep 3  # two samples: utilisation needs a period
sshddp top --once nccl-native; echo "exit $?"
sshddp top --json nccl-native >"$out/top.json"; echo "json exit $?"
python3 - "$out/top.json" ~/.sshddp/runs/nccl-native/n0/samples.jsonl <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print("nodes:", [{k: n.get(k) for k in ("host", "gpus", "gpu_util", "gpu_mem")} for n in doc["nodes"]])
print("ranks:", [{k: r.get(k) for k in ("rank", "gpu_util", "gpu_mem")} for r in doc["ranks"]])
last = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print("sampler:", last["gpu_source"], last["gpus"])
PY
step "nvidia-smi at the same moment, to compare"
nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu --format=csv
sshddp stop nccl-native; echo "exit $?"
step "the stopped run's exit record: its GPU usage over the samples it kept"
python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"])' ~/.sshddp/runs/nccl-native/n0/exit.json
sleep 1
step "GPU processes left after the stop (expect none)"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
echo "count: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
