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
# relays trainer streams (install_sdc_guard.sh --relay-uids wrote
# SDC_RELAY_LISTEN); else sdcd's trainer port on the head node, the address
# install_sdc_guard.sh wrote (SDC_TRAINER_COORDINATOR).
sdc_agent_defaults="${SDC_AGENT_DEFAULTS:-/etc/default/sdc-agent}"
if [[ -z "${SDC_COORDINATOR:-}" && -r "$sdc_agent_defaults" ]]; then
  SDC_COORDINATOR="$(sed -n 's/^SDC_RELAY_LISTEN=//p' "$sdc_agent_defaults" | tail -n 1)"
  if [[ -z "$SDC_COORDINATOR" ]]; then
    SDC_COORDINATOR="$(sed -n 's/^SDC_TRAINER_COORDINATOR=//p' "$sdc_agent_defaults" | tail -n 1)"
  fi
fi
unset sdc_agent_defaults
if [[ -z "${SDC_COORDINATOR:-}" ]]; then
  echo "trainer-env.sh: SDC_COORDINATOR is unset and /etc/default/sdc-agent has none;" \
    "the trainer runs its checks in-band only" >&2
fi
export SDC_COORDINATOR="${SDC_COORDINATOR:-}"

# Dialing sdcd itself (not the relay socket): TLS, presenting this node's
# certificate, which proves the rank's node (docs/operations.md, "Trust
# model"). install_sdc_guard.sh --pki made the files; the key is readable by
# the trainers' group (--trainer-group).
sdc_tls_dir="${SDC_TLS_DIR:-/etc/sdc-guard/tls}"
if [[ -n "$SDC_COORDINATOR" && "$SDC_COORDINATOR" != unix:* && -z "${SDC_TLS_CA:-}" &&
  -r "$sdc_tls_dir/ca.crt" ]]; then
  export SDC_TLS_CA="$sdc_tls_dir/ca.crt"
  if [[ -r "$sdc_tls_dir/node.key" ]]; then
    export SDC_TLS_CERT="${SDC_TLS_CERT:-$sdc_tls_dir/node.crt}"
    export SDC_TLS_KEY="${SDC_TLS_KEY:-$sdc_tls_dir/node.key}"
  else
    echo "trainer-env.sh: cannot read $sdc_tls_dir/node.key (not in the trainers' group?):" \
      "sdcd refuses this rank without the node's certificate" >&2
  fi
fi
unset sdc_tls_dir

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
