#!/usr/bin/env bash
# The GPU benchmarks and GPU tests, in one call on a lent GPU machine (see docs/benchmarks.md).
#
#   bash benchmarks/gpu_suite.sh PART [PART ...]
#
# Parts: infer (inference throughput, Qwen2.5-0.5B shape: every sampling mode at 256, 512 and 1,024 concurrent
# sequences, engine and HTTP, GRPO groups; INFER_ARGS adds options, e.g. "--variants sdpa" or "--profile 64"),
# httpab (greedy and top-p at 256 and 1,024 through the engine and HTTP with the server's defaults, with
# --switch-interval-us 100, with --http-frontend process and, given BASE_TREE, an older tree's code),
# hostparts (where a decode step's host time goes with the real runner: engine_host_overhead.py --runner real,
# batches HOST_BATCHES, 256 and 1,024), attn (decode attention by SDPA backend and the Triton kernel), kernel (the Triton decode kernel's GPU tests),
# graphs (CUDA-graph decode test),
# async (async vs sync RL on 2 GPUs: server on one, trainer on the other, NCCL weight updates),
# async_inplace (eta=2 with rollout.pause_mode=in_place: in-flight requests kept across updates),
# async_bounds (in place: eta=0, eta=2 under the default staleness bound, then eta=2 under
# rollout.staleness_bound=admission from the same warm start), async_shared (one GPU: server and
# trainer colocated on it, disk weight updates, eta=0 and eta=2 in place), async_ipc (the same with
# shared-memory weight updates: CUDA IPC from the trainer's buffer, and a longer SFT warm start),
# sharedgpu (the CUDA IPC test), lmhead (the chunked LM head's time and memory per chunk size and
# kind of chunk kernels), lmkernels (the LM head's Triton kernels' GPU tests), sampling (sort vs sort-free
# sampled step and the Triton kernel's configurations, benchmarks/sampling_kernels.py, then their GPU tests), rlstep (an RL step: log-prob forward + PPO
# update with both MFUs, benchmarks/rl_step_throughput.py; RL_ARGS adds options),
# train (train throughput, 1 GPU, the engine's defaults: compiled, no FSDP, 8 blocks a compiled graph and the
# logits kept, all by auto; profiled; TRAIN_ARGS adds options), train_groups (the same with 4
# decoder blocks a compiled graph; BLOCKS_PER_GRAPH sets another number), train_kept (the same with the
# LM head's logits kept for the backward), train_flat (8 blocks a graph, logits kept, and no FSDP:
# fsdp_wrap=none; BLOCKS_PER_GRAPH sets another number), attnbench (the varlen flash attention by length mix, benchmarks/varlen_attention.py),
# train_eager (train without torch.compile),
# train2 (dp=2 per-block, dp=2 as one FSDP unit, and tp=2 on two GPUs), wrap (train2 without tp=2), gputests (every test marked gpu),
# flatgpu (fsdp_wrap=none against one FSDP unit on a GPU), bcast (NCCL broadcast between
# two GPU processes by CUDA_VISIBLE_DEVICES, benchmarks/weight_broadcast.py).
# Each part runs under its own time limit and a failure does not stop the next one. Results go to
# benchmarks/results/ and, when $OUT is set (the device tool), a copy of them and a tarball of the
# logs to $OUT. The machine needs torch, transformers and the wheels in .whl/ (git-ignored; fetch them with
# `pip download --no-deps --python-version 3.12 --only-binary=:all: -c constraints.txt -d .whl lark fastapi starlette uvicorn h11 click
# pydantic pydantic-core annotated-types annotated-doc typing-inspection typing-extensions anyio aiohttp multidict
# yarl propcache frozenlist aiosignal aiohappyeyeballs attrs idna uvloop httptools msgspec`): the embedded server needs
# fastapi/uvicorn/pydantic and msgspec (and runs its HTTP side on uvloop and httptools, as the serve extra installs it),
# the config parser lark, the RL client aiohttp; the constraints pin the versions the project is tested
# with (an unpinned fastapi 0.137 imports opentelemetry, which the GPU image lacks).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-}
LOGS=$(mktemp -d)
SITE=/tmp/areal_site
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then
    python -m pip install -q --no-index --no-deps --upgrade --target "$SITE" .whl/*.whl 2>&1 | grep -v -i "warning" || true
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python - <<'PY'
import importlib, sys
import torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "gpus", torch.cuda.device_count())
for name in ("fastapi", "uvicorn", "httpx", "pydantic", "msgspec", "safetensors", "tokenizers", "yaml", "tqdm", "lark", "peft"):
    try:
        print(f"  {name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except ImportError as exc:
        print(f"  {name} MISSING ({exc})")
PY

# 0.5B-shaped Qwen2 (24 layers, hidden 896, GQA 14/2) with the model kit's own small vocabulary
QWEN05_TINY='tiny:qwen2?hidden_size=896&num_hidden_layers=24&intermediate_size=4864&num_attention_heads=14&num_key_value_heads=2'

# the two-GPU async runs: server on one GPU, trainer on the other, NCCL weight updates
ASYNC_GPU=(cluster.gpus_per_node=2 allocation=embedded:d1+fsdp:d1 rollout.weight_update=collective
    "model.path=$QWEN05_TINY" "rollout.server.extra_args=[--max-running-requests,256]"
    rollout.max_concurrent_rollouts=128 train.sft_lr=1e-3 actor.optimizer.lr=2e-5
    evaluation.max_eval_prompts=32 evaluation.n_samples=2)

# the async parts: ASYNC_RL_STEPS RL steps a run (32), the first ASYNC_WARMUP (2) the warm-up that the
# throughput leaves out (torch.compile, the first weight update; benchmarks/async_vs_sync.py); ASYNC_ARGS adds
# config overrides to every run; ASYNC_LIMIT sets each async part's time limit in seconds
ASYNC_STEPS=(--steps "${ASYNC_RL_STEPS:-32}" --warmup-steps "${ASYNC_WARMUP:-2}")

part() {  # part NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    echo "=== $name (limit ${limit}s): $*"
    timeout --kill-after=15 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$LOGS/$name.log"
    echo "=== $name: rc=$rc in $((SECONDS - started))s"
}

save() {  # results and logs go to $OUT after every part, so a call cut short keeps what ran
    [[ -n $OUT ]] || return 0
    # logs and metrics only: no weights, checkpoints or tokenizers
    tar -czf "$OUT/logs.tgz" --exclude='*.safetensors' --exclude='*.distcp' --exclude='*.pt' --exclude='*.bin' \
        --exclude='tokenizer*' -C "$LOGS" .
    tar -czf "$OUT/results.tgz" benchmarks/results
}

keep_steps() {  # keep_steps WORK NAME: each eta's per-step metrics of a benchmark run, next to its JSON
    local f eta
    for f in "$LOGS/$1"/eta*/rl_metrics.jsonl; do
        [[ -f $f ]] || continue
        eta=$(basename "$(dirname "$f")")
        cp "$f" "benchmarks/results/$2_${eta}_rl_metrics.jsonl"
    done
}

dp2_wraps() {  # dp2_wraps SECONDS: dp=2 per block, then as one FSDP unit
    local name wrap
    for name in train_dp2:block train_dp2_root:root; do
        wrap=${name#*:}
        part "${name%%:*}" "$1" torchrun --nproc-per-node 2 benchmarks/train_throughput.py \
            --preset qwen2.5-0.5b --fsdp-wrap "$wrap"
        save
    done
}

for p in "$@"; do
    case $p in
        infer) part infer 600 python benchmarks/inference_throughput.py --preset qwen2.5-0.5b --http --hf-batches 256 \
            --concurrency 256,512,1024 --check 2 --repeats 1 --sampling ${INFER_ARGS:-} ;;
        httpab) # the engine and areal serve over HTTP, this tree with each server mode, back to back on one machine;
            # BASE_TREE (an older tree: `git archive <commit> areal_tasks benchmarks storage | tar -x -C DIR`) adds
            # its run; HTTPAB_VARIANTS picks from: default si100 process base
            for v in ${HTTPAB_VARIANTS:-default si100 process base}; do
                flags=() dir=.
                case $v in
                    si100) flags=(--server-switch-interval-us 100) ;;
                    process) flags=(--server-http-frontend process) ;;
                    base) [[ -n ${BASE_TREE:-} ]] || continue; dir=$BASE_TREE ;;
                esac
                part "httpab_$v" 200 env -C "$dir" PYTHONPATH="$SITE:$(cd "$dir" && pwd)" python \
                    benchmarks/inference_throughput.py --preset qwen2.5-0.5b --concurrency 256,1024 --modes greedy,top_p \
                    --groups 0 --http --variants= --hf-batches= --check 0 --repeats 1 \
                    --out "$PWD/benchmarks/results/inference_throughput_cuda_httpab_$v.json" "${flags[@]}"
                save
            done ;;
        hostparts) part hostparts 420 python benchmarks/engine_host_overhead.py --runner real --device cuda \
            --preset qwen2.5-0.5b --prompt-len 128 --new-tokens 256 --batches ${HOST_BATCHES:-256,1024} --repeats 2 ;;
        attn) part attn 150 python benchmarks/decode_attention.py ;;
        kernel) part kernel 150 python -m pytest -q tests/gpu/test_decode_kernel_gpu.py ;;
        graphs) part graphs 240 python -m pytest -q -m gpu tests/integration/inference_server/test_gpu_graphs.py ;;
        varlen) part varlen 90 python -m pytest -q -s tests/gpu/test_varlen_attention_gpu.py ;;
        async) part async "${ASYNC_LIMIT:-450}" python benchmarks/async_vs_sync.py --sft-steps 50 "${ASYNC_STEPS[@]}" \
            --etas 0 2 --work "$LOGS/async_work" --out benchmarks/results/async_vs_sync_gpu_steady.json -- \
            "${ASYNC_GPU[@]}" ${ASYNC_ARGS:-}
            keep_steps async_work async_vs_sync_gpu_steady ;;
        async_inplace) warm=()  # the async part's warm start when it ran first
            [[ -d $LOGS/async_work/sft/sft ]] && warm=(--model "$LOGS/async_work/sft/sft")
            part async_inplace "${ASYNC_LIMIT:-240}" python benchmarks/async_vs_sync.py "${warm[@]}" --sft-steps 50 \
            "${ASYNC_STEPS[@]}" --etas 2 --work "$LOGS/async_inplace_work" \
            --out benchmarks/results/async_vs_sync_gpu_in_place_steady.json -- \
            "${ASYNC_GPU[@]}" rollout.pause_mode=in_place ${ASYNC_ARGS:-}
            keep_steps async_inplace_work async_vs_sync_gpu_in_place_steady ;;
        async_bounds)
            part async_sample "${ASYNC_LIMIT:-480}" python benchmarks/async_vs_sync.py --sft-steps 50 "${ASYNC_STEPS[@]}" \
                --etas 0 2 --work "$LOGS/async_bounds_work" --out benchmarks/results/async_vs_sync_gpu_bounds_sample.json \
                -- "${ASYNC_GPU[@]}" rollout.pause_mode=in_place ${ASYNC_ARGS:-}
            keep_steps async_bounds_work async_vs_sync_gpu_bounds_sample
            save
            part async_admission "${ASYNC_LIMIT:-240}" python benchmarks/async_vs_sync.py \
                --model "$LOGS/async_bounds_work/sft/sft" "${ASYNC_STEPS[@]}" --etas 2 --work "$LOGS/async_admission_work" \
                --out benchmarks/results/async_vs_sync_gpu_bounds_admission.json -- \
                "${ASYNC_GPU[@]}" rollout.pause_mode=in_place rollout.staleness_bound=admission ${ASYNC_ARGS:-}
            keep_steps async_admission_work async_vs_sync_gpu_bounds_admission ;;
        async_shared) part async_shared "${ASYNC_LIMIT:-560}" python benchmarks/async_vs_sync.py --sft-steps 50 \
                "${ASYNC_STEPS[@]}" --etas 0 2 --work "$LOGS/async_shared_work" \
                --out benchmarks/results/async_vs_sync_gpu_shared_steady.json -- \
                "${ASYNC_GPU[@]}" cluster.gpus_per_node=1 "allocation=embedded[rollout]:d1|fsdp[actor]:d1" \
                rollout.weight_update=disk rollout.pause_mode=in_place ${ASYNC_ARGS:-}
            keep_steps async_shared_work async_vs_sync_gpu_shared_steady ;;
        async_ipc) part async_ipc "${ASYNC_LIMIT:-560}" python benchmarks/async_vs_sync.py --sft-steps "${SFT_STEPS:-200}" \
                "${ASYNC_STEPS[@]}" --etas 0 2 --work "$LOGS/async_ipc_work" \
                --out benchmarks/results/async_vs_sync_gpu_shared_ipc_steady.json -- \
                "${ASYNC_GPU[@]}" cluster.gpus_per_node=1 "allocation=embedded[rollout]:d1|fsdp[actor]:d1" \
                rollout.weight_update=shared rollout.pause_mode=in_place "train.sft_lr=${SFT_LR:-1e-3}" ${ASYNC_ARGS:-}
            keep_steps async_ipc_work async_vs_sync_gpu_shared_ipc_steady ;;
        lmhead) part lmhead 240 python benchmarks/lm_head_chunks.py ;;
        sampling) part sampling 130 python benchmarks/sampling_kernels.py
            save
            part samplinggpu 200 python -m pytest -q -s tests/gpu/test_sampling_gpu.py tests/gpu/test_sampling_triton_gpu.py ;;
        rlstep) part rlstep 180 python benchmarks/rl_step_throughput.py --preset qwen2.5-0.5b ${RL_ARGS:-} ;;
        lmkernels) part lmkernels 150 python -m pytest -q tests/gpu/test_lm_head_kernels_gpu.py ;;
        sharedgpu) part sharedgpu 120 python -m pytest -q tests/gpu/test_shared_weights_gpu.py ;;
        train) part train1 240 python benchmarks/train_throughput.py --preset qwen2.5-0.5b --profile ${TRAIN_ARGS:-} ;;
        train_groups) part train1_groups 300 python benchmarks/train_throughput.py --preset qwen2.5-0.5b --profile \
            --compile-blocks-per-graph ${BLOCKS_PER_GRAPH:-4} ${TRAIN_ARGS:-} ;;
        train_flat) part train1_flat 300 python benchmarks/train_throughput.py --preset qwen2.5-0.5b --profile \
            --fsdp-wrap none --compile-blocks-per-graph ${BLOCKS_PER_GRAPH:-8} --lm-head-keep-logits ${TRAIN_ARGS:-} ;;
        attnbench) part attnbench 150 python benchmarks/varlen_attention.py ;;
        train_kept) part train1_kept 240 python benchmarks/train_throughput.py --preset qwen2.5-0.5b --profile \
            --lm-head-keep-logits ${TRAIN_ARGS:-} ;;
        train_eager) part train1_eager 120 python benchmarks/train_throughput.py --preset qwen2.5-0.5b --compile off \
            --out benchmarks/results/train_throughput_qwen2.5-0.5b_dp1sp1tp1_eager.json ;;
        train2) dp2_wraps 240
                part train_tp2 120 torchrun --nproc-per-node 2 benchmarks/train_throughput.py --preset qwen2.5-0.5b --tp 2 ;;
        wrap) dp2_wraps 200 ;;
        gputests) part gputests 420 python -m pytest -q -m gpu tests/gpu tests/integration/inference_server/test_gpu_graphs.py ;;
        fsdpgpu) part fsdpgpu 150 python -m pytest -q tests/gpu/test_fsdp_gpu.py ;;
        flatgpu) part flatgpu 240 python -m pytest -q tests/gpu/test_flat_params_gpu.py ;;
        bcast) part bcast 120 python benchmarks/weight_broadcast.py ;;
        *) echo "unknown part $p" ;;
    esac
    save
done

