# megatron core_v0.19.0 settings exported by planner from a plan (planner.plan/v1).
# model llama3-70b  fingerprint 7e381656f4b31948  input_hash 5cc53ea2991b3558  planner 0.1.0
# plan (made for target any): dp=2 tp=8+sp pp=4 mb=1x64 gpipe rc=full zero=1, placement tp-pp-dp
# on 64 x h100 (dgx-h100: 8 nodes x 8); global batch 128 x 4096 tokens, bf16, adam
# Written for megatron core_v0.19.0 (the default release for megatron; plan export --engine-version for another).
# Use: source this file, then pass "${MEGATRON_PARALLEL_ARGS[@]}" to pretrain_gpt.py with your
# model (--hidden-size, --num-attention-heads, ...), data and optimizer arguments. The
# tensor-parallel split of each layer is Megatron's own.
#
# Not expressed exactly, or not at all (each also warned on stderr; docs/exports.md):
# - schedule GPipe: Megatron-LM runs 1F1B, which has the same bubble and keeps fewer micro-batches
#   in flight (less activation memory than planned)
# - memory not re-checked with the model states as Megatron-Core lays them out (fp32 main
#   gradients): the plan does not record how it laid them out (made before plans recorded it);
#   `plan solve llama3-70b --cluster dgx-h100 --nodes 8 --global-batch 128 --seq-len 4096 --fix
#   tp=8,pp=4,recompute=full --target megatron` prices it as megatron runs it

# tensor parallelism: Megatron-LM's validate_args requires CUDA_DEVICE_MAX_CONNECTIONS=1 (on GPUs before Blackwell)
export CUDA_DEVICE_MAX_CONNECTIONS=1

MEGATRON_PARALLEL_ARGS=(
  # data-parallel size 2 follows from the world size: launch on 64 GPUs = tp 8 x pp 4 x dp 2
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4
  --sequence-parallel
  # placement tp-pp-dp (Megatron's default order is tp-dp-pp)
  --use-tp-pp-dp-mapping
  # 64 micro-batches of 1 per step and data-parallel rank
  --micro-batch-size 1 --global-batch-size 128 --seq-length 4096
  # 80 layers in model.layers
  --num-layers 80
  # layers per stage: 20, 20, 20, 20 (even: Megatron's default split)
  # recompute full
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  # ZeRO-1: the distributed optimizer
  --use-distributed-optimizer
  # gradients reduced behind the last micro-batch's backward, the updated weights gathered behind the next step's first forward, as priced
  --overlap-grad-reduce --overlap-param-gather
  # dtype bf16
  --bf16
)
