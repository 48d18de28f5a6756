"""What the guard sets up or says on its own, so that nothing surprises a
first run:
  * ``prepare_cuda()`` (at import): audits run with deterministic algorithms,
    which cuBLAS refuses unless CUBLAS_WORKSPACE_CONFIG is set before CUDA
    starts; when it is unset and CUDA has not started, it is set here
    (``:4096:8``). Imported after CUDA started, it stays unset, and a guard
    with audits on a CUDA model refuses with an error naming it (a guard
    with ``audit_every=0`` needs nothing).
  * ``checkpoint_notice(...)``: a trial run without sdcd hears once, from
    rank 0, what the checkpoint gate will do, and how to choose
    (``checkpoint_fallback=``).
"""

import os
import sys

import torch

CUBLAS_SETTING = ":4096:8"
_told = set()


def prepare_cuda():
    """Sets CUBLAS_WORKSPACE_CONFIG when it is unset and CUDA has not started;
    returns what it set, or None."""
    if "CUBLAS_WORKSPACE_CONFIG" in os.environ or torch.cuda.is_initialized():
        return None
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_SETTING
    return CUBLAS_SETTING


def checkpoint_notice(coordinator, fallback):
    """The one line a run without a coordinator gets; None with one.
    ``fallback`` is the engine's checkpoint fallback ("veto" or "in-band")."""
    if coordinator:
        return None
    if fallback == "in-band":
        gate = ("allows a checkpoint only when every replica holds the same weights and no step "
                "failed a check since the last one (checkpoint_fallback='in-band')")
    else:
        gate = ("vetoes every checkpoint: may_checkpoint() stays False (pass "
                "checkpoint_fallback='in-band' to allow one when every replica holds the same "
                "weights and no step failed a check since the last one)")
    return ("sdc_guard: no coordinator (SDC_COORDINATOR or coordinator= names sdcd): the checks "
            "run in-band, nothing is recorded and no GPU is named; the checkpoint gate " + gate)


def say_once(key, line, rank):
    """Prints ``line`` on stderr from rank 0, once per process and ``key``."""
    if line is None or rank != 0 or key in _told:
        return False
    _told.add(key)
    print(line, file=sys.stderr, flush=True)
    return True
