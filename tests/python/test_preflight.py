"""The preflight (issue 40, item 2): at the first audit each rank replays
its own first micro-batch and compares the bits with what it trained on. A
loss function that does not reproduce the trained loss (each mistake below
as real code makes it) stops the job there, every rank with the same
GuardError naming what differed, the likely causes and the fix for each,
instead of spending every audit step skipping for a configuration error."""

import re

import pytest

from conftest import progress_lines, start_job, wait_job

# mistake -> extra flags
MISTAKES = {
    "autocast-outside": ["--model=bn-mlp", "--amp=bf16"],
    "token-weighted": ["--micro_batches=2", "--batch=4"],
    "aux-outside": ["--model=bn-mlp"],
    "python-random": ["--model=bn-mlp"],
}
# What the error says of each (the fix the message gives for it).
FIX = {
    "autocast-outside": "put the `with torch.autocast(...)` inside loss_fn",
    "token-weighted": "carry the count in the batch and divide by it inside loss_fn",
    "aux-outside": "add it inside loss_fn",
    "python-random": "draw from torch's default generator",
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_loss_fn_that_differs_from_training_stops_the_job_with_the_cause(tmp_path, mistake):
    directory = str(tmp_path / "job")
    procs, logs = start_job(directory, 3, ["--steps=3", f"--mistake={mistake}",
                                           *MISTAKES[mistake]],
                            {"SDC_JOB_ID": f"preflight-{mistake}", "SDC_AUDIT_EVERY": "2"})
    assert wait_job(procs, 150), "a rank hung"
    # torch.distributed prefixes each line of an uncaught exception with "[rankN]: ".
    texts = [re.sub(r"^\[rank\d+\]: ", "", open(l).read(), flags=re.M) for l in logs]
    errors = set()
    for rank, text in enumerate(texts):
        assert procs[rank].returncode != 0, text[-2000:]
        at = text.find("GuardError: FAILED_PRECONDITION: preflight at step 2: ")
        assert at >= 0, text[-3000:]
        message = text[at:text.index("micro_batches (times the GradScaler's scale", at)]
        errors.add(message)
        assert "the loss differs (rank 2)" in message, message
        assert FIX[mistake] in message
        # Step 1 trained; the job stopped at the first audit, before any skip.
        steps = [l for l in progress_lines(directory, rank) if "step" in l]
        assert [(s["step"], s["apply"]) for s in steps] == [(1, True)], steps
    assert len(errors) == 1, "every rank raises the same error"
