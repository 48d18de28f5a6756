"""FSDP2 without replicas and ZeRO-1 (issue 44, item 3): the buddy check of
the sharded optimizer step and of stored shards at rest. examples/hsdp_train.py
with --replicas=1 (fully_shard on a 1-D mesh) or --zero (DDP and a
ZeroRedundancyOptimizer) on 6 Gloo ranks on 3 "nodes" (rank r on node
r // 2), a real sdcd. Rank r's buddy is r + 2 (the next node), the third of a
mismatch r + 4 (the remaining node)."""

import os

import pytest
import torch

from conftest import ROOT, progress_lines, run_job, start_job, wait_job
from sdc_guard import buddy, shard_replay

SCRIPT = os.path.join(ROOT, "examples", "hsdp_train.py")
WORLD = 6
FSDP = ["--replicas=1", f"--shards={WORLD}"]
ZERO = ["--zero"]
FAULTS = {"SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing"}


def test_pairs_put_buddy_and_third_on_other_nodes():
    nodes = ["a", "a", "b", "b", "c", "c"]
    b, t = buddy.pairs(nodes)
    assert b == [2, 3, 4, 5, 0, 1]  # One owner per buddy.
    assert t == [4, 5, 0, 1, 2, 3]
    for r in range(6):
        assert len({nodes[r], nodes[b[r]], nodes[t[r]]}) == 3
    # Two nodes: a buddy, no third (a mismatch is then undecided).
    assert buddy.pairs(["a", "b", "a", "b"]) == ([1, 2, 3, 0], [None] * 4)
    # One node: no buddy.
    assert buddy.pairs(["a", "a"]) == ([None, None], [None, None])


def test_windows_cover_every_element_once():
    sizes = [10, 3, 0, 25]
    w = buddy.windows(sizes, 8)
    assert w == 5  # ceil(38 / 8)
    seen = []
    for check in range(w):
        for i, a, b in buddy.segments(sizes, 8, check):
            seen.extend((i, k) for k in range(a, b))
    assert seen == [(i, k) for i, n in enumerate(sizes) for k in range(n)]
    assert buddy.segments(sizes, 8, w) == buddy.segments(sizes, 8, 0)  # Rotation.


OPTIMIZERS = [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, dampening=0)),
    (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.01, amsgrad=True)),
    (torch.optim.AdamW, dict(lr=1e-2)),
    (torch.optim.AdamW, dict(lr=1e-2, foreach=True)),
]


@pytest.mark.parametrize("cls,settings", OPTIMIZERS)
def test_a_slice_recomputed_is_the_full_step_bit_for_bit(cls, settings):
    # Elementwise updates do not depend on slicing: unaligned slices of a
    # tensor large enough for ATen to split across threads and vectorise,
    # recomputed from the slice's inputs, equal the full step's bits.
    n = 100_003
    g = torch.Generator().manual_seed(0)
    full = torch.nn.Parameter(torch.randn(n, generator=g))
    optimizer = cls([full], **settings)
    compared = 0
    for _ in range(3):
        full.grad = torch.randn(n, generator=g)
        before = {"param": full.detach().clone(), "grad": full.grad.clone(),
                  "state": {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                            for k, v in optimizer.state.get(full, {}).items()}}
        optimizer.step()
        for a, b in [(0, 1000), (3, 77_777), (12_345, n), (5, 37), (40_000, n)]:
            state = {k: (v[a:b] if isinstance(v, torch.Tensor) and v.dim() > 0 else v)
                     for k, v in before["state"].items()}
            group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
            package = {"optimizer": cls.__name__, "segments": [(0, a, b, 0)],
                       "params": [before["param"][a:b]], "grads": [before["grad"][a:b]],
                       "state": [state], "groups": {0: group}}
            assert buddy.recompute(package) == buddy.slice_digest([full.detach()[a:b]])
            compared += 1
    assert compared == 15


def test_an_optimizer_not_elementwise_turns_the_check_off_saying_why():
    p = torch.nn.Parameter(torch.zeros(4, 4))
    assert buddy.not_elementwise_reason(torch.optim.AdamW([p])) == ""
    reason = buddy.not_elementwise_reason(torch.optim.Adafactor([p]))
    assert "Adafactor is not known to update each element" in reason, reason


def clean_and_identical(tmp_path, flags, env):
    """The job guarded and unguarded: every guarded step applied, both
    checkpoints allowed, and the same losses and final shards bit for bit.
    Returns the guarded run's (steps, finals)."""
    guarded, guarded_final = run_job(str(tmp_path / "guarded"), WORLD, flags, env,
                                     script=SCRIPT)
    plain, plain_final = run_job(str(tmp_path / "plain"), WORLD, flags + ["--unguarded"],
                                 script=SCRIPT)
    for rank in range(WORLD):
        assert all(s["apply"] for s in guarded[rank]), guarded[rank]
        assert [s["checkpoint"] for s in guarded[rank] if "checkpoint" in s] == ["allowed"] * 2
        assert [s["loss"] for s in guarded[rank]] == [s["loss"] for s in plain[rank]], rank
        assert guarded_final[rank]["shard_digest"] == plain_final[rank]["shard_digest"], rank
    return guarded, guarded_final


def test_guarded_fsdp_is_bit_identical_to_unguarded_and_clean(tmp_path, sdcd):
    # The buddy check at steps 2, 4, 6 and replay audits (every rank
    # replaying its ring partner at once, shard_replay.py) at steps 3, 6.
    flags = FSDP + ["--steps=6", "--checkpoint_every=3", "--optimizer=sgd"]
    env = {"SDC_JOB_ID": "fsdp-clean", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2", "SDC_BUDDY_SLICE": "64", "SDC_AUDIT_EVERY": "3"}
    guarded, guarded_final = clean_and_identical(tmp_path, flags, env)
    digests = set()
    for rank in range(WORLD):
        digests.add(guarded_final[rank]["shard_digest"])
        g = guarded_final[rank]["guard"]
        assert g["buddy_checks"] == 3 and g["buddy_findings"] == 0, g  # Steps 2, 4, 6.
        assert g["sharded_audits"] == 2 and g["sharded_audit_mismatches"] == 0, g  # Steps 3, 6.
        assert g["buddy_bytes_sent"] > 0 and g["buddy_vetoes"] == 0, g
        assert g["skipped"] == 0 and g["reports_dropped"] == 0, g
    assert len(digests) == WORLD  # Six different shards.
    assert sdcd.sdcctl("get", "incidents", "--job=fsdp-clean")["incidents"] == []


def test_fsdp_update_fault_and_corruption_at_rest_are_named_and_vetoed(tmp_path, sdcd):
    # Step 2 (a check): rank 3's optimizer update of its slice is wrong in
    # one element; its buddy (rank 5, node c) and the third (rank 1, node a)
    # recompute it and agree with each other. Step 4's check records every
    # shard after the step; one bit of rank 1's stored shard then flips at
    # rest, seen before step 5's optimizer step.
    ckpt = tmp_path / "checkpoints"
    flags = FSDP + ["--steps=6", "--checkpoint_every=2", "--corrupt_at_rest=1:4",
                    f"--checkpoint_dir={ckpt}"]
    env = {"SDC_JOB_ID": "fsdp-faults", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2", "SDC_BUDDY_SLICE": "64",
           "SDC_INJECT_FAULT": "shard-update:3:step=2", **FAULTS}
    steps, finals = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    for rank in range(WORLD):
        by_step = {s["step"]: s for s in steps[rank]}
        # Each finding skips the next step on every rank, naming the rank.
        assert not by_step[3]["apply"], by_step[3]
        assert "failed on rank 3" in by_step[3]["reason"], by_step[3]
        assert ("buddy check (faulty): rank 3's optimizer update of its shard at step 2 is "
                "wrong; ranks 5 and 1 recomputed it and agree") in by_step[3]["reason"], by_step[3]
        assert not by_step[6]["apply"], by_step[6]
        assert ("buddy check (suspect): rank 1's stored shard changed at rest between step 4's "
                "and step 5's optimizer steps") in by_step[6]["reason"], by_step[6]
        assert all(by_step[s]["apply"] for s in (1, 2, 4, 5)), steps[rank]
        # The checkpoint after the corrupted update, and every later one, vetoed.
        assert [by_step[s]["checkpoint"] for s in (2, 4, 6)] == ["vetoed"] * 3, by_step
        g = finals[rank]["guard"]
        assert g["buddy_findings"] == 2 and g["buddy_vetoes"] == 3, g
    assert os.listdir(ckpt) == [], "a vetoed checkpoint is never written"
    incidents = sdcd.sdcctl("get", "incidents", "--job=fsdp-faults")["incidents"]
    named = {(tuple(i.get("ranks", [])), i.get("outcome"), i.get("step")) for i in incidents}
    assert ((3,), "faulty", "3") in named or ((3,), "faulty", 3) in named, incidents
    assert ((1,), "suspect", "6") in named or ((1,), "suspect", 6) in named, incidents
    assert len(incidents) == 2, "\n".join(
        repr((i["id"], i["step"], i["check"], i.get("outcome"), i.get("ranks"),
              i.get("explanation", "")[:300])) for i in incidents)


def test_guarded_zero_is_bit_identical_to_unguarded_and_clean(tmp_path, sdcd):
    # DDP + ZeroRedundancyOptimizer(AdamW): the buddy check verifies each
    # rank's partition update at steps 2 and 4; check 1, the weight vote
    # and the replay audit (step 3) run as for DDP.
    flags = ZERO + ["--steps=4", "--checkpoint_every=2", "--optimizer=adamw", "--audit_every=3"]
    env = {"SDC_JOB_ID": "zero-clean", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2", "SDC_BUDDY_SLICE": "64"}
    guarded, guarded_final = clean_and_identical(tmp_path, flags, env)
    for rank in range(WORLD):
        assert [s["step"] for s in guarded[rank] if s["audited"]] == [3], guarded[rank]
        assert {s["audit_outcome"] for s in guarded[rank] if s["audited"]} == {"pass"}
        g = guarded_final[rank]["guard"]
        assert g["buddy_checks"] == 2 and g["buddy_findings"] == 0, g
        assert g["buddy_bytes_sent"] > 0 and g["buddy_vetoes"] == 0, g
        assert g["skipped"] == 0 and g["reports_dropped"] == 0 and g["audits"] == 1, g
    # Replicas after ZeRO's broadcasts: one model.
    assert len({f["shard_digest"] for f in guarded_final}) == 1
    assert sdcd.sdcctl("get", "incidents", "--job=zero-clean")["incidents"] == []


def test_zero_update_fault_and_corruption_at_rest_are_named_and_vetoed(tmp_path, sdcd):
    # Step 2 (a check): rank 3's SGD update of its ZeRO partition is wrong in
    # one element, and ZeRO broadcasts it to every replica, so the weight
    # vote sees one model; rank 3's buddy (rank 5) and the third (rank 1)
    # recompute it from the same inputs and agree with each other. As step 5
    # begins (after step 4's vote) a bit of rank 1's partition flips at rest:
    # seen before step 5's optimizer step, whose update ZeRO then broadcasts.
    flags = ZERO + ["--steps=6", "--checkpoint_every=2", "--optimizer=sgd",
                    "--corrupt_at_rest=1:4"]
    env = {"SDC_JOB_ID": "zero-fault", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2", "SDC_BUDDY_SLICE": "64",
           "SDC_INJECT_FAULT": "shard-update:3:step=2", **FAULTS}
    steps, finals = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    for rank in range(WORLD):
        by_step = {s["step"]: s for s in steps[rank]}
        assert not by_step[3]["apply"], by_step[3]
        assert "failed on rank 3" in by_step[3]["reason"], by_step[3]
        assert ("buddy check (faulty): rank 3's optimizer update of its ZeRO partition at step 2 "
                "is wrong; ranks 5 and 1 recomputed it and agree") in by_step[3]["reason"]
        assert not by_step[6]["apply"], by_step[6]
        assert ("buddy check (suspect): rank 1's stored ZeRO partition changed at rest between "
                "step 4's and step 5's optimizer steps") in by_step[6]["reason"], by_step[6]
        assert all(by_step[s]["apply"] for s in (1, 2, 4, 5)), steps[rank]
        # The checkpoint after the corrupted update, and every later one, vetoed.
        assert [by_step[s]["checkpoint"] for s in (2, 4, 6)] == ["vetoed"] * 3, by_step
        g = finals[rank]["guard"]
        assert g["buddy_findings"] == 2 and g["buddy_vetoes"] == 3, g
    assert len({f["shard_digest"] for f in finals}) == 1  # The broadcasts spread both.
    incidents = sdcd.sdcctl("get", "incidents", "--job=zero-fault")["incidents"]
    named = sorted((tuple(i.get("ranks", [])), i.get("outcome"), str(i.get("step")))
                   for i in incidents)
    assert named == [((1,), "suspect", "6"), ((3,), "faulty", "3")], incidents


def test_replay_rounds_give_each_rank_one_replay_per_round():
    # Every rank runs one forward and backward per round (FSDP's collectives).
    assert shard_replay.rounds([(2, 0), (3, 1), (0, 2)], 4) == [[(2, 0), (3, 1), (0, 2)]]
    assert shard_replay.rounds([(1, 0), (1, 2), (3, 1), (1, 3)], 4) == \
        [[(1, 0), (3, 1)], [(1, 2)], [(1, 3)]]
    assert shard_replay.rounds([], 4) == []


# Issue 44, item 4: replay audits under FSDP2. Rank r's micro-batch is
# replayed by rank r + 2 (the next node) while every rank replays at once;
# a mismatch by rank r + 4 (the remaining node).
AUDITS = {"SDC_AUDIT_EVERY": "2", "SDC_WEIGHT_CHECK_EVERY": "0"}


def test_fsdp_activation_and_local_gradient_faults_on_audit_steps_are_named(tmp_path, sdcd):
    # Step 2: an activation of rank 3's forward is scaled (its loss is
    # wrong); step 4: one element of rank 0's local gradients is off by
    # 2^-10 relative (its loss is right, FSDP unit 0's reduce-scatter input
    # is not).
    ckpt = tmp_path / "checkpoints"
    flags = FSDP + ["--steps=4", "--checkpoint_every=2", f"--checkpoint_dir={ckpt}",
                    "--corrupt_grad=0:4"]
    env = {"SDC_JOB_ID": "fsdp-audit-fault", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_INJECT_FAULT": "activation-scale:3:step=2", **AUDITS, **FAULTS}
    steps, finals = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    for rank in range(WORLD):
        by_step = {s["step"]: s for s in steps[rank]}
        # The audit step itself is skipped on every rank, naming rank 3.
        assert not by_step[2]["apply"], by_step[2]
        assert "failed on rank 3" in by_step[2]["reason"], by_step[2]
        assert ("buddy check (faulty): rank 3's forward/backward of its micro-batch at step 2 "
                "(replay audit) is wrong (its loss); ranks 5 and 1 replayed it and agree"
                ) in by_step[2]["reason"], by_step[2]
        assert not by_step[4]["apply"], by_step[4]
        assert ("buddy check (faulty): rank 0's forward/backward of its micro-batch at step 4 "
                "(replay audit) is wrong (its local gradients); ranks 2 and 4 replayed it and "
                "agree") in by_step[4]["reason"], by_step[4]
        assert all(by_step[s]["apply"] for s in (1, 3)), steps[rank]
        # The checkpoint after it (and the next: the faulty rank is still in the job) vetoed.
        assert [by_step[s]["checkpoint"] for s in (2, 4)] == ["vetoed"] * 2, by_step
        g = finals[rank]["guard"]
        assert g["sharded_audits"] == 2 and g["sharded_audit_mismatches"] == 2, g
    assert os.listdir(ckpt) == [], "a vetoed checkpoint is never written"
    incidents = sdcd.sdcctl("get", "incidents", "--job=fsdp-audit-fault")["incidents"]
    assert sorted((i.get("ranks"), i.get("outcome"), str(i.get("step"))) for i in incidents) \
        == [([0], "faulty", "4"), ([3], "faulty", "2")], incidents
    assert {i.get("check") for i in incidents} == {"CHECK_REPLAY"}, incidents


REPLAY_AUDITS = {"SDC_AUDIT_EVERY": "2"}


@pytest.mark.parametrize("where", ["before-forward", "after-forward"])
def test_a_sharded_replay_raising_on_one_rank_fails_the_step_alike_everywhere(
        tmp_path, sdcd, where):
    # Rank 2's loss_fn raises while it replays a peer's micro-batch at the
    # audit of step 2, before the model runs or after it (FSDP's collectives
    # of that replay not yet begun, or done): every rank leaves the replay at
    # the same agreement and raises the same GuardError; the trainer trains on.
    job = f"fsdp-replay-raises-{where}"
    flags = FSDP + ["--steps=3", "--optimizer=sgd", f"--replay_raises=2:{where}",
                    "--on_guard_error=continue"]
    env = {"SDC_JOB_ID": job, "SDC_COORDINATOR": sdcd.trainer_address, **REPLAY_AUDITS}
    steps, finals = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT,
                            timeout=150)
    errors = set()
    for rank in range(WORLD):
        by_step = {s["step"]: s for s in steps[rank]}
        assert [by_step[s]["apply"] for s in (1, 2, 3)] == [True, False, True], steps[rank]
        assert "guard_error" not in by_step[1] and "guard_error" not in by_step[3]
        errors.add(by_step[2]["guard_error"])
        assert finals[rank]["guard"]["sharded_audits"] == 1, finals[rank]
    assert len(errors) == 1, errors  # The same error, word for word, on every rank.
    error = errors.pop()
    assert error.startswith("INTERNAL: step 2 failed on rank 2 and was skipped on every "
                            "rank: "), error
    stage = "before the forward" if where == "before-forward" else \
        "between forward and backward"
    assert f"a sharded replay of rank 0's micro-batch raised ({stage}): ValueError: " \
        f"INJECTED replay error {where} on rank 2" in error, error


def test_a_sharded_replay_raising_inside_fsdp_collectives_ends_every_rank_at_once(
        tmp_path, sdcd):
    # Rank 2's replay raises between two FSDP units' all-gathers: its peers
    # wait in a collective it will never join. It raises ABORTED and ends;
    # every peer's collective fails as its connections close and each raises
    # ABORTED too, long before the process group's timeout (torch's default,
    # 30 minutes; this test's is 150 s).
    flags = FSDP + ["--steps=3", "--optimizer=sgd", "--replay_raises=2:mid-forward"]
    env = {"SDC_JOB_ID": "fsdp-replay-raises-mid", "SDC_COORDINATOR": sdcd.trainer_address,
           **REPLAY_AUDITS}
    procs, logs = start_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    ended = wait_job(procs, 150)
    text = [open(l).read() for l in logs]
    assert ended, "a rank hung:\n" + "\n".join(t[-2000:] for t in text)
    for rank in range(WORLD):
        assert procs[rank].returncode != 0, text[rank][-2000:]
        assert "ABORTED: the sharded replay audit of step 2 failed on rank " \
            f"{rank} where its peers wait in FSDP's collectives" in text[rank], \
            text[rank][-3000:]
    assert ("a sharded replay of rank 0's micro-batch raised (forward): ValueError: "
            "INJECTED replay error mid-forward on rank 2") in text[2], text[2][-3000:]


# Issue 44, item 6: torch.distributed.checkpoint checkpoints of sharded
# state through ProvisionalCheckpoints. FSDP2: every rank writes its own
# shards of the parameters and of AdamW's state (DTensors); ZeRO-1: the model
# once, and each rank its own partition's optimizer state (TrainingState).
@pytest.mark.parametrize("layout", ["fsdp", "zero"])
def test_sharded_checkpoints_are_promoted_revoked_and_restored_bit_identically(
        tmp_path, sdcd, layout):
    # Checkpoints 2 and 4 are allowed while clean (2 turns final when 4 is
    # allowed); at step 6 rank 3's optimizer update of its shard is wrong:
    # the buddy check names it, checkpoint 6 is vetoed (never written), step
    # 7 carries the finding to sdcd (skipped on every rank), and sdcd revokes
    # the provisional checkpoint 4 (the fault may predate it), so the restore
    # point stays step 2, whose restore loads the very bits written and
    # trains on as the first run did.
    ckpt = tmp_path / "checkpoints"
    shape = FSDP if layout == "fsdp" else ZERO
    job = f"{layout}-checkpoints"
    env = {"SDC_COORDINATOR": sdcd.trainer_address, "SDC_WEIGHT_CHECK_EVERY": "2",
           "SDC_BUDDY_SLICE": "64", "SDC_AUDIT_EVERY": "0"}
    steps, _ = run_job(
        str(tmp_path / "train"), WORLD,
        shape + ["--steps=7", "--checkpoint_every=2", f"--checkpoint_dir={ckpt}"],
        {**env, "SDC_JOB_ID": job, "SDC_INJECT_FAULT": "shard-update:3:step=6", **FAULTS},
        script=SCRIPT)
    for rank in range(WORLD):
        by_step = {s["step"]: s for s in steps[rank]}
        assert [by_step[s]["checkpoint"] for s in (2, 4, 6)] == ["allowed", "allowed", "vetoed"]
        assert all(by_step[s]["apply"] for s in range(1, 7)), steps[rank]
        assert not by_step[7]["apply"] and "failed on rank 3" in by_step[7]["reason"], by_step[7]
    assert sorted(os.listdir(ckpt)) == ["step-2.dcp"], "4 revoked and deleted, 6 never written"
    assert ".metadata" in os.listdir(ckpt / "step-2.dcp")
    incidents = sdcd.sdcctl("get", "incidents", f"--job={job}")["incidents"]
    assert [(i.get("ranks"), i.get("outcome")) for i in incidents] == [([3], "faulty")], incidents

    resume_dir = tmp_path / "resume"
    resumed, resumed_finals = run_job(
        str(resume_dir), WORLD, shape + ["--steps=4", f"--checkpoint_dir={ckpt}", "--resume"],
        {**env, "SDC_JOB_ID": f"{job}-resumed"}, script=SCRIPT)
    for rank in range(WORLD):
        restored = [l for l in progress_lines(str(resume_dir), rank) if "restored" in l]
        assert [l["restored"] for l in restored] == [2], restored
        # The shards (ZeRO: the model) and this rank's optimizer state (its
        # shards; ZeRO: its partition's) as checkpoint 2 wrote them, bit for bit.
        assert restored[0]["shard_digest"] == steps[rank][1]["shard_digest"], rank
        assert restored[0]["optimizer_digest"] == steps[rank][1]["optimizer_digest"], rank
        assert [s["step"] for s in resumed[rank]] == [3, 4], resumed[rank]
        assert resumed[rank][0]["loss"] == steps[rank][2]["loss"], rank
        if layout == "fsdp":
            # Steps 3 and 4 train as they did, to the bit.
            assert resumed[rank][1]["loss"] == steps[rank][3]["loss"], rank
            assert resumed_finals[rank]["shard_digest"] == steps[rank][3]["shard_digest"], rank
        # ZeRO (DDP): not compared after step 3's loss. Plain DDP with AdamW
        # and no guard, saved at step 2 and resumed on 6 Gloo ranks, already
        # trains step 3 to other last bits than the run that went on (at 2
        # ranks it does not), with weights and optimizer state restored
        # equal: a resumed DDP job's first backward is DDP's first iteration,
        # whose gradient buckets are laid out before DDP rebuilds them, and
        # Gloo's ring sums an element in an order set by its place in the
        # bucket (the likely cause; docs/benchmarks.md, 2026-12-06).
    assert sdcd.sdcctl("get", "incidents", f"--job={job}-resumed")["incidents"] == []
