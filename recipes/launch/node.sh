#!/bin/bash
# One node of a multi-node run: accelerate starts one training process per GPU here and meets
# the other nodes at MAIN_ADDR:MAIN_PORT. slurm.sbatch runs it on every node through srun,
# k8s-job.yaml in every pod.
#
#   NNODES=2 NODE_RANK=0 MAIN_ADDR=node0 bash recipes/launch/node.sh SCRIPT RECIPE ACCELERATE_CONFIG [--key value ...]
#
# Environment: NNODES and NODE_RANK (required), MAIN_ADDR (the rank-0 node), MAIN_PORT (29500),
# GPUS_PER_NODE (the accelerate config's processes a machine), MEDRECIPES and ACCELERATE (the commands, when not on PATH). The launch
# numbers come from `medrecipes launch-plan` unless the caller exported them already.
set -euo pipefail
script=$1 recipe=$2 config=$3
shift 3

if [ -z "${NUM_PROCESSES:-}" ]; then
    eval "$(${MEDRECIPES:-medrecipes} launch-plan "$recipe" --method "$(basename "$script" .py)" \
        --nodes "$NNODES" ${GPUS_PER_NODE:+--gpus-per-node "$GPUS_PER_NODE"} --accelerate-config "$config" "$@")"
fi

# Preemption: the launcher hands SIGTERM and SIGUSR1 on to the training processes and waits
# the recipe's grace time for their checkpoint before it kills them.
export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=$PREEMPTION_GRACE_SECONDS

launch=(
    ${ACCELERATE:-accelerate} launch
    --config_file "$config"
    --num_machines "$TRAIN_NODES"
    --num_processes "$NUM_PROCESSES"
    --machine_rank "$NODE_RANK"
    --main_process_ip "$MAIN_ADDR"
    --main_process_port "${MAIN_PORT:-29500}"
    --gradient_accumulation_steps "$GRADIENT_ACCUMULATION_STEPS"
    "$script" "$recipe" "$@"
)
echo "node $NODE_RANK of $TRAIN_NODES: ${launch[*]}"
exec "${launch[@]}"
