# megatron core_v0.19.0 settings exported by planner from a plan (planner.plan/v1).
# model llama3-8b  fingerprint 0709f7404e613820  input_hash 6e34e27d6e1913f1  planner 0.1.0
# plan (made for target any): dp=2 tp=2+sp pp=4 mb=1x32 1f1b rc=selective zero=1, placement tp-dp-pp
# on 16 x h100 (dgx-h100: 2 nodes x 8); global batch 64 x 4096 tokens, bf16, adam
# Written for megatron core_v0.19.0 (the default release for megatron; plan export --engine-version for another).
# Use: source this file, then pass "${MEGATRON_PARALLEL_ARGS[@]}" to pretrain_gpt.py with your
# model (--hidden-size, --num-attention-heads, ...), data and optimizer arguments. The
# tensor-parallel split of each layer is Megatron's own.
#
# Not expressed exactly, or not at all (each also warned on stderr; docs/exports.md):
# - memory not re-checked with the model states as Megatron-Core lays them out (fp32 main
#   gradients): the plan does not record how it laid them out (made before plans recorded it);
#   `plan solve llama3-8b --cluster dgx-h100 --nodes 2 --global-batch 64 --seq-len 4096 --fix
#   tp=2,pp=4,recompute=selective --target megatron` prices it as megatron runs it

# tensor parallelism: Megatron-LM's validate_args requires CUDA_DEVICE_MAX_CONNECTIONS=1 (on GPUs before Blackwell)
export CUDA_DEVICE_MAX_CONNECTIONS=1

MEGATRON_PARALLEL_ARGS=(
  # data-parallel size 2 follows from the world size: launch on 16 GPUs = tp 2 x pp 4 x dp 2
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
  --sequence-parallel
  # 32 micro-batches of 1 per step and data-parallel rank
  --micro-batch-size 1 --global-batch-size 64 --seq-length 4096
  # 32 layers in model.layers
  --num-layers 32
  # layers per stage: 8, 9, 9, 6 (uneven: first/last stage sizes, the rest even)
  --decoder-first-pipeline-num-layers 8 --decoder-last-pipeline-num-layers 6
  # recompute selective
  --recompute-granularity selective
  # ZeRO-1: the distributed optimizer
  --use-distributed-optimizer
  # gradients reduced behind the last micro-batch's backward, the updated weights gathered behind the next step's first forward, as priced
  --overlap-grad-reduce --overlap-param-gather
  # dtype bf16
  --bf16
)
