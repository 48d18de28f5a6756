"""sdc-guard for PyTorch DistributedDataParallel jobs.

Catches silent data corruption (a GPU returning wrong but plausible numbers)
inside training, names the faulty GPU through the sdcd coordinator, and keeps
corrupted weights out of checkpoints. The checks are sdc-guard's C++ trainer
client, a libtorch class library built for each supported torch version and
loaded by ``sdc_guard._C`` (no CPython code in it: one package for every
Python); this package fits it to an ordinary DDP loop::

    model = DDP(net, device_ids=[local_rank])
    guard = sdc_guard.Guard(model, optimizer, loss_fn=lambda m, batch: ...)
    checkpoints = sdc_guard.ProvisionalCheckpoints(guard, "checkpoints/")
    state = {"train": sdc_guard.TrainingState(model, optimizer)}
    for step, batch in enumerate(loader, 1):
        with guard.step(step, batch) as s:
            s.backward(loss_fn(model, batch))
        guard.optimizer_step(optimizer)       # applies or skips, as GradScaler.step
        if step % 1000 == 0:
            checkpoints.checkpoint(step, state)  # the gate, then a provisional save

Settings come from the same SDC_* environment variables as the C++ client
(SDC_COORDINATOR, SDC_JOB_ID, ...); keyword arguments of Guard override them.
"""

import torch  # First: the engine library finds torch's libraries in the process.
import torch.distributed  # noqa: F401  (registers the ProcessGroup class the engine takes)

from sdc_guard import notices
from sdc_guard._C import GuardError
from sdc_guard.checkpoints import ProvisionalCheckpoints, TrainingState
from sdc_guard.guard import Guard, Step

# Audits need cuBLAS deterministic, which it reads before CUDA starts.
notices.prepare_cuda()

__all__ = ["Guard", "GuardError", "ProvisionalCheckpoints", "Step", "TrainingState"]
__version__ = "0.2.0"
