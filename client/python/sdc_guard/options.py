"""Guard's keyword arguments: the SDC_* variable each overrides and the
checks applied before the C++ engine validates the value again; the Python
front end's own options (every_step, buddy_slice); and what a sharded
layout refuses."""

import math
import numbers
import os
import sys

from sdc_guard import buddy

# Keyword arguments of Guard and the SDC_* variable each overrides, with the
# check applied before the C++ side validates the value again.
KNOWN = {
    "job_id": ("SDC_JOB_ID", "text"),
    "coordinator": ("SDC_COORDINATOR", "text"),
    "node_name": ("SDC_NODE_NAME", "text"),
    "gpu_uuid": ("SDC_GPU_UUID", "text"),
    "local_rank": ("LOCAL_RANK", "count"),
    "replica_group": ("SDC_REPLICA_GROUP", "count"),
    "audit_every": ("SDC_AUDIT_EVERY", "count"),
    "weight_check_every": ("SDC_WEIGHT_CHECK_EVERY", "count"),
    "verdict_wait_ms": ("SDC_VERDICT_WAIT_MS", "count"),
    "checkpoint_wait_ms": ("SDC_CHECKPOINT_WAIT_MS", "count"),
    "checkpoint_fallback": ("SDC_CHECKPOINT_FALLBACK", "text"),
    "report_linger_ms": ("SDC_REPORT_LINGER_MS", "count"),
    "report_buffer": ("SDC_REPORT_BUFFER", "count"),
    "report_buffer_mb": ("SDC_REPORT_BUFFER_MB", "count"),
    "reconnect_max_ms": ("SDC_RECONNECT_MAX_MS", "count"),
    "small_collectives": ("SDC_SMALL_COLLECTIVES", "text"),
    "max_grad_norm": ("SDC_MAX_GRAD_NORM", "number"),
    "parameter_fingerprints": ("SDC_PARAMETER_FINGERPRINTS", "flag"),
    "vote_buffers": ("SDC_VOTE_BUFFERS", "flag"),
    "metrics_listen": ("SDC_METRICS_LISTEN", "text"),
    # The outer launcher's count of attempts (the attempt is it times 10^6
    # plus torchrun's TORCHELASTIC_RESTART_COUNT) and the step of the
    # checkpoint this attempt resumed from.
    "attempt": ("SDC_ATTEMPT", "count"),
    "resume_step": ("SDC_RESUME_STEP", "count"),
}

# Guard's own options (the Python front end's), not the engine's.
EVERY_STEP = ("every_step", "SDC_EVERY_STEP")
BUDDY_SLICE = ("buddy_slice", "SDC_BUDDY_SLICE")


def variables(options):
    """SDC_* overrides from Guard's keyword arguments; ValueError names the argument."""
    out = {}
    for name, value in options.items():
        if value is None:
            continue
        variable, kind = KNOWN[name]
        if kind == "count":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"{name}={value!r}: expected a non-negative integer")
            out[variable] = str(int(value))
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"{name}={value!r}: expected a non-negative finite number")
            out[variable] = repr(float(value))
        elif kind == "flag":
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r}: expected True or False")
            out[variable] = "1" if value else "0"
        else:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}={value!r}: expected a non-empty string")
            out[variable] = value
    return out


def every_step(value):
    """Whether the every-step checksums run: ``value`` (True or False), else
    SDC_EVERY_STEP (0 or 1), else off. ValueError for anything else."""
    name, variable = EVERY_STEP
    if value is not None:
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r}: expected True or False")
        return value
    text = os.environ.get(variable, "")
    if text not in ("", "0", "1"):
        raise ValueError(f"{variable}={text!r}: expected 0 or 1")
    return text == "1"


def buddy_slice(value):
    """Elements per buddy check (FSDP): ``value``, else SDC_BUDDY_SLICE,
    else buddy.DEFAULT_SLICE. ValueError for anything but a positive integer."""
    name, variable = BUDDY_SLICE
    if value is None:
        text = os.environ.get(variable, "")
        if not text:
            return buddy.DEFAULT_SLICE
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{variable}={text!r}: expected a positive integer")
        return int(text)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}={value!r}: expected a positive integer")
    return int(value)


def check_sharded(layout, options, comm_hook):
    """ValueError for what a sharded layout does not take; rank 0 says once
    which checks run (replay audits: shard_replay.py)."""
    if comm_hook is not None:
        raise ValueError("comm_hook: an FSDP2 module has no DDP communication hook (the guard "
                         "checks FSDP's reduce-scatter itself)")
    if options.get("replica_group") is not None:
        raise ValueError("replica_group: on an HSDP module the guard takes each rank's replica "
                         "group from the DeviceMesh (the ranks that hold one shard)")
    if options.get("max_grad_norm") or float(os.environ.get("SDC_MAX_GRAD_NORM", "0") or 0):
        raise ValueError("max_grad_norm: not on an HSDP module (a rank sees only its shard's "
                         "norm); clip with torch.nn.utils.clip_grad_norm_, which reduces it")
    if layout.kind == "fsdp":
        if layout.shard_index == 0:
            print(f"sdc_guard: FSDP over {layout.shard_count} shards, no replicas: the buddy "
                  "check verifies each shard's optimizer update on weight-check steps; replay "
                  "audits replay every rank's ring partner at once (shard_replay.py)", file=sys.stderr,
                  flush=True)
    elif layout.kind == "tp":
        if layout.replica_index == 0 and layout.shard_index == 0:
            print(f"sdc_guard: tensor parallel over {layout.shard_count} tp ranks x "
                  f"{layout.replica_count} dp replicas: the weight vote runs per tp shard across "
                  "dp; replay audits replay whole tp groups at once (tensor_parallel.py)",
                  file=sys.stderr, flush=True)
    elif layout.replica_index == 0 and layout.shard_index == 0:
        print(f"sdc_guard: HSDP over {layout.replica_count} replicas x {layout.shard_count} "
              "shards: the weight vote runs per shard; replay audits replay every rank's ring "
              "partner at once (shard_replay.py)", file=sys.stderr, flush=True)


def names():
    """The keyword options Guard takes (its error for an unknown one lists them)."""
    return list(KNOWN) + [EVERY_STEP[0], BUDDY_SLICE[0]]
