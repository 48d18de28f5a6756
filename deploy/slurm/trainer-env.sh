# shellcheck shell=bash
# sdc-guard trainer environment for Slurm jobs on SageMaker HyperPod.
# Installed as /usr/local/share/sdc-guard/trainer-env.sh by
# lifecycle/install_sdc_guard.sh. Source it on every node of the job, inside
# the srun step (not only in the batch script: SDC_NODE_NAME must be the node
# each task runs on, and a value exported by the batch script would reach
# every node unchanged):
#
#   #!/bin/bash
#   #SBATCH --nodes=4 --ntasks-per-node=1 --exclusive
#   srun bash -c 'source /usr/local/share/sdc-guard/trainer-env.sh &&
#     exec torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=8 \
#       --rdzv-backend=c10d --rdzv-endpoint="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):29500" \
#       --rdzv-id="$SLURM_JOB_ID" train.py'
#
# torchrun sets LOCAL_RANK for each process; the client reads SDC_GPU_UUID
# from NVML when it is unset. Variables already set in the environment win,
# so `SDC_AUDIT_EVERY=50 srun ...` works. See client/options.h for the rest
# (SDC_VERDICT_WAIT_MS, SDC_CHECKPOINT_FALLBACK, SDC_TLS_CA, ...).

# The coordinator: $SDC_COORDINATOR if set; else this node's agent when it
# relays trainer streams (install_sdc_guard.sh --relay wrote
# SDC_RELAY_LISTEN); else sdcd on the head node, at the address
# install_sdc_guard.sh wrote for the agent.
sdc_agent_defaults="${SDC_AGENT_DEFAULTS:-/etc/default/sdc-agent}"
if [[ -z "${SDC_COORDINATOR:-}" && -r "$sdc_agent_defaults" ]]; then
  SDC_COORDINATOR="$(sed -n 's/^SDC_RELAY_LISTEN=//p' "$sdc_agent_defaults" | tail -n 1)"
  if [[ -z "$SDC_COORDINATOR" ]]; then
    SDC_COORDINATOR="$(sed -n 's/^SDC_COORDINATOR=//p' "$sdc_agent_defaults" | tail -n 1)"
  fi
fi
unset sdc_agent_defaults
if [[ -z "${SDC_COORDINATOR:-}" ]]; then
  echo "trainer-env.sh: SDC_COORDINATOR is unset and /etc/default/sdc-agent has none;" \
    "the trainer runs its checks in-band only" >&2
fi
export SDC_COORDINATOR="${SDC_COORDINATOR:-}"

# One id for every rank of the job; a job's steps share it.
if [[ -z "${SLURM_JOB_ID:-}" && -z "${SDC_JOB_ID:-}" ]]; then
  echo "trainer-env.sh: neither SLURM_JOB_ID nor SDC_JOB_ID is set: source me inside a Slurm job" >&2
fi
export SDC_JOB_ID="${SDC_JOB_ID:-${SLURM_JOB_ID:-}}"

# The node this task runs on, as Slurm names it: what the slurm actuator
# passes to `scontrol update node=...`. On HyperPod it is the host name.
export SDC_NODE_NAME="${SLURMD_NODENAME:-$(hostname)}"

export SDC_AUDIT_EVERY="${SDC_AUDIT_EVERY:-100}"
export SDC_WEIGHT_CHECK_EVERY="${SDC_WEIGHT_CHECK_EVERY:-10}"
