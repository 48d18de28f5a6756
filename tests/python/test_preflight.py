"""The preflight (issue 40, item 2): at the first audit each rank replays
its own first micro-batch and compares the bits with what it trained on. A
loss function that does not reproduce the trained loss (each mistake below
as real code makes it) stops the job, every rank with the same GuardError
naming what differed, the likely causes and the fix for each, instead of
spending every audit step skipping for a configuration error. Not at the
first difference (issue 45): a transient fault on that step looks the same
in one try, so the step is skipped on every rank and the preflight runs
again at the next audit step; a mistake differs again there and stops the
job."""

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
    procs, logs = start_job(directory, 3, ["--steps=5", f"--mistake={mistake}",
                                           *MISTAKES[mistake]],
                            {"SDC_JOB_ID": f"preflight-{mistake}", "SDC_AUDIT_EVERY": "2"})
    assert wait_job(procs, 150), "a rank hung"
    # torch.distributed prefixes each line of an uncaught exception with "[rankN]: ".
    texts = [re.sub(r"^\[rank\d+\]: ", "", open(l).read(), flags=re.M) for l in logs]
    errors = set()
    for rank, text in enumerate(texts):
        assert procs[rank].returncode != 0, text[-2000:]
        at = text.find("GuardError: FAILED_PRECONDITION: preflight at step 4: ")
        assert at >= 0, text[-3000:]
        message = text[at:text.index("micro_batches (times the GradScaler's scale", at)]
        errors.add(message)
        assert "the loss differs (rank 2)" in message, message
        assert FIX[mistake] in message
        # Steps 1 and 3 trained; the first audit (2) was skipped for the
        # retry, and the job stopped at the second (4).
        steps = [l for l in progress_lines(directory, rank) if "step" in l]
        assert [(s["step"], s["apply"]) for s in steps] == [(1, True), (2, False), (3, True)], steps
        assert steps[1]["reason"].startswith("the preflight at step 2 differed (the loss differs "
                                             "(rank 2)"), steps[1]
        assert "re-run at the next audit step" in steps[1]["reason"], steps[1]
    assert len(errors) == 1, "every rank raises the same error"
