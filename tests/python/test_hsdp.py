"""HSDP (issue 44, items 1 and 2): examples/hsdp_train.py, FSDP2's fully_shard
on a 3 x 2 replicate x shard DeviceMesh, 6 Gloo ranks on 3 "nodes", against a
real sdcd. Rank r holds shard r % 2 as replica r // 2, on node r // 2, so each
shard's three replicas are on three nodes and each shard's replica group votes
by a strict majority of three.

Covered here: check 1 on each rank's local gradients (FSDP's reduce-scatter
input) and on the reduced shard (after the replicate all-reduce), the weight
vote per shard, the checkpoint gate with torch.distributed.checkpoint sharded
state dicts (issue 44, item 6), and replay audits with every rank replaying
its ring partner at once (item 4: rank r's micro-batch replayed by rank r + 2,
another replica of the same shard on the next node; a mismatch by r + 4).

The clean run (with its DCP checkpoints) and the faults run again on tensor
parallel (item 5, "tp": --tp=2, a 3 x 2 (dp, tp) mesh, the Mlp Colwise/Rowwise over tp and
replicated over dp by FSDP2's replicate): rank r is tp rank r % 2 of dp
replica r // 2 on node r // 2, so "shard" below reads "tp rank" there, and
the vote names the tp rank whose shard differs. Replay audits replay whole
tp groups: ranks 2 and 3 replay ranks 0 and 1's micro-batch together."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, python_env, run_job

SCRIPT = os.path.join(ROOT, "examples", "hsdp_train.py")
WORLD, SHARDS = 6, 2
FAULTS = {"SDC_ALLOW_FAULT_INJECTION": "yes-i-am-testing"}


def shard_of(rank):
    return rank % SHARDS


# Per layout: its flags.
LAYOUTS = {"hsdp": [], "tp": ["--tp=2"]}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_guarded_hsdp_is_bit_identical_to_unguarded_and_clean(tmp_path, sdcd, layout):
    job = f"{layout}-clean"
    flags = ["--steps=6", "--checkpoint_every=3"] + LAYOUTS[layout]
    env = {"SDC_JOB_ID": job, "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2", "SDC_AUDIT_EVERY": "2"}
    # The guarded job saves what the gate allows: torch.distributed.checkpoint
    # sharded state dicts (on tp each rank's tp shards; item 6 on tp).
    ckpt = tmp_path / "checkpoints"
    guarded, guarded_final = run_job(str(tmp_path / "guarded"), WORLD,
                                     flags + [f"--checkpoint_dir={ckpt}"], env, script=SCRIPT)
    plain, plain_final = run_job(str(tmp_path / "plain"), WORLD, flags + ["--unguarded"],
                                 script=SCRIPT)
    for rank in range(WORLD):
        assert [s["step"] for s in guarded[rank]] == list(range(1, 7))
        assert all(s["apply"] for s in guarded[rank]), guarded[rank]
        assert [s["checkpoint"] for s in guarded[rank] if "checkpoint" in s] == ["allowed"] * 2
        # json keeps a float's every bit: equal text is equal bits.
        assert [s["loss"] for s in guarded[rank]] == [s["loss"] for s in plain[rank]], rank
        assert guarded_final[rank]["shard_digest"] == plain_final[rank]["shard_digest"], rank
        g = guarded_final[rank]["guard"]
        assert g["skipped"] == 0 and g["reports_dropped"] == 0, g
        assert g["weight_checks"] >= 3, g  # Steps 2, 4, 6 and the checkpoint at 3.
        # Replays leave training as it was (the losses and shards above).
        assert g["sharded_audits"] == 3 and g["sharded_audit_mismatches"] == 0, g
    # Replicas of a shard hold the same bits; the two shards are different tensors.
    by_shard = {s: {guarded_final[r]["shard_digest"] for r in range(WORLD) if shard_of(r) == s}
                for s in range(SHARDS)}
    assert all(len(d) == 1 for d in by_shard.values()), by_shard
    assert by_shard[0] != by_shard[1]
    assert sdcd.sdcctl("get", "incidents", f"--job={job}")["incidents"] == []
    # Checkpoint 3 was finalised when 6 was allowed; 6 stays provisional.
    assert sorted(os.listdir(ckpt)) == ["step-3.dcp", "step-6.dcp.provisional"]
    assert ".metadata" in os.listdir(ckpt / "step-3.dcp")
    if layout != "tp":
        return  # HSDP's resume: test_hsdp_checkpoints_are_sharded_kept_provisional_and_...
    # A restart restores checkpoint 3's tp shards and their optimizer state
    # and trains steps 4 - 6 as the first run did, bit for bit.
    resumed, resumed_final = run_job(
        str(tmp_path / "resumed"), WORLD, LAYOUTS[layout] + [
            "--steps=6", f"--checkpoint_dir={ckpt}", "--resume"],
        {**env, "SDC_JOB_ID": f"{job}-resumed"}, script=SCRIPT)
    for rank in range(WORLD):
        assert [s["step"] for s in resumed[rank]] == [4, 5, 6], resumed[rank]
        assert [s["loss"] for s in resumed[rank]] == [s["loss"] for s in guarded[rank][3:]], rank
        assert resumed_final[rank]["shard_digest"] == guarded_final[rank]["shard_digest"], rank
    assert sdcd.sdcctl("get", "incidents", f"--job={job}-resumed")["incidents"] == []


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_hsdp_faults_are_caught_named_and_vetoed(tmp_path, sdcd, layout):
    # Three faults in one job, on three ranks:
    #   step 2: a NaN in rank 2's local gradients (before the reduce-scatter;
    #           on tp before the dp all-reduce);
    #   step 4: rank 3 (replica 1 of shard 1) corrupts its optimizer update;
    #   step 6: one bit of rank 4's stored shard (replica 2 of shard 0) flips
    #           at rest, outside the guard.
    ckpt = tmp_path / "checkpoints"
    job = f"{layout}-faults"
    flags = ["--steps=6", "--checkpoint_every=2", "--corrupt_at_rest=4:6",
             f"--checkpoint_dir={ckpt}"] + LAYOUTS[layout]
    env = {"SDC_JOB_ID": job, "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2",
           "SDC_INJECT_FAULT": "nan-gradient:2:step=2,weight:3:step=4", **FAULTS}
    steps, finals = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    for rank in range(WORLD):
        by_step = {s["step"]: s for s in steps[rank]}
        # Check 1: every rank skips step 2, naming rank 2.
        assert not by_step[2]["apply"], by_step[2]
        assert "NaN/Inf in the local gradients of rank 2" in by_step[2]["reason"]
        assert all(by_step[s]["apply"] for s in (1, 3, 4, 5, 6)), steps[rank]
        # The per-shard vote: the checkpoints after each weight fault are vetoed.
        assert by_step[4]["checkpoint"] == "vetoed", by_step[4]
        assert by_step[6]["checkpoint"] == "vetoed", by_step[6]
    assert os.listdir(ckpt) == [], "a vetoed checkpoint is never written"

    incidents = sdcd.sdcctl("get", "incidents", f"--job={job}")["incidents"]
    weights = [i for i in incidents if i.get("check") == "CHECK_WEIGHTS"]
    named = {tuple(i.get("ranks", [])) for i in weights}
    assert (3,) in named and (4,) in named, weights
    assert named <= {(3,), (4,)}, weights  # No healthy replica is named.
    rank3 = next(i for i in weights if i.get("ranks") == [3])
    assert "holds shard 1/2" in rank3["explanation"], rank3
    assert "2 of 3" in rank3["explanation"], rank3
    rank4 = next(i for i in weights if i.get("ranks") == [4])
    assert "holds shard 0/2" in rank4["explanation"], rank4
    nonfinite = [i for i in incidents if i.get("check") == "CHECK_NONFINITE"]
    assert [i.get("ranks") for i in nonfinite] == [[2]], nonfinite

    # The faults landed in the trained shards themselves. Rank 3's was
    # repaired from shard 1's majority at step 5 or 6 (once ranks 1, 3 and
    # 5 held step 4's verdict); rank 4's flip came after the last step, so
    # it differs from its shard's two healthy replicas, which agree.
    digest = [f["shard_digest"] for f in finals]
    assert [s["step"] for s in steps[3] if s["repaired"]] in ([5], [6]), steps[3]
    assert digest[1] == digest[5] == digest[3]
    assert digest[0] == digest[2] != digest[4]


def test_a_corrupted_hsdp_replica_is_repaired_from_its_shards_majority(tmp_path, sdcd):
    # One bit of rank 3's shard (shard 1, replica 1) flips after step 2's
    # optimizer step; step 2's vote per shard names it (2 of 3 replicas) and
    # vetoes checkpoint 2. Once ranks 1, 3 and 5 all hold the verdict, the
    # next step's agreement repairs rank 3 from a majority replica of shard
    # 1 (its local shards and AdamW state, point to point across the
    # replicate dim), verified by fingerprint after the copy; shard 0's
    # replicas take no part.
    flags = ["--steps=6", "--checkpoint_every=2"]
    env = {"SDC_JOB_ID": "hsdp-repair", "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_WEIGHT_CHECK_EVERY": "2", "SDC_AUDIT_EVERY": "0",
           "SDC_INJECT_FAULT": "weight:3:step=2", **FAULTS}
    steps, finals = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    plain, plain_finals = run_job(str(tmp_path / "plain"), WORLD, flags + ["--unguarded"],
                                  script=SCRIPT)
    repaired_at = {r: [s["step"] for s in steps[r] if s["repaired"]] for r in range(WORLD)}
    assert len(repaired_at[3]) == 1 and repaired_at[3][0] > 2, repaired_at
    for rank in range(WORLD):
        # The same step on every rank of shard 1's group, none on shard 0's.
        assert repaired_at[rank] == (repaired_at[3] if shard_of(rank) == 1 else []), repaired_at
        assert all(s["apply"] for s in steps[rank]), steps[rank]
        assert steps[rank][1]["checkpoint"] == "vetoed", steps[rank][1]
        # Before the flipped bit reached a forward, training was the clean run's.
        assert [s["loss"] for s in steps[rank][:2]] == [s["loss"] for s in plain[rank][:2]]
    incidents = sdcd.sdcctl("get", "incidents", "--job=hsdp-repair")["incidents"]
    weights = [i for i in incidents if i.get("check") == "CHECK_WEIGHTS"]
    assert [i.get("ranks") for i in weights] == [[3]], weights
    assert "holds shard 1/2" in weights[0]["explanation"], weights[0]
    # Every replica of each shard holds the same bits again.
    digest = [f["shard_digest"] for f in finals]
    assert digest[1] == digest[3] == digest[5], digest
    assert digest[0] == digest[2] == digest[4], digest
    # Not the clean run's bits: from step 3 to the repair, replica 1's
    # forward all-gathered rank 3's corrupted shard, and its gradients went
    # through the reduce-scatter and the replicate all-reduce into every
    # replica's update (the repair copies weights, it does not undo steps).
    plain_digest = [f["shard_digest"] for f in plain_finals]
    assert digest[0] != plain_digest[0] and digest[1] != plain_digest[1]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_hsdp_activation_fault_on_an_audit_step_is_named_and_vetoed(tmp_path, sdcd, layout):
    # Rank 1 (shard 1, replica 0; on tp: tp rank 1 of dp replica 0) scales an
    # activation of its step-2 forward; rank 3 replays its micro-batch (on
    # tp with rank 2, which replays rank 0's), rank 5 breaks the tie (with 4).
    # At audit step 4 rank 4 nudges one element of an activation's gradient
    # (a finite local-gradient fault; its loss is right): rank 0 replays it,
    # rank 2 breaks the tie.
    job = f"{layout}-audit"
    flags = ["--steps=4", "--checkpoint_every=2", "--corrupt_grad=4:4"] + LAYOUTS[layout]
    env = {"SDC_JOB_ID": job, "SDC_COORDINATOR": sdcd.trainer_address,
           "SDC_AUDIT_EVERY": "2", "SDC_INJECT_FAULT": "activation-scale:1:step=2", **FAULTS}
    steps, _ = run_job(str(tmp_path / "job"), WORLD, flags, env, script=SCRIPT)
    incidents = sdcd.sdcctl("get", "incidents", f"--job={job}")["incidents"]
    for rank in range(WORLD):
        step2, step3, step4 = steps[rank][1:4]
        assert not step2["apply"] and step2["checkpoint"] == "vetoed", step2
        assert step3["apply"], step3
        assert not step4["apply"] and step4["checkpoint"] == "vetoed", step4
        # The local gradients are the rank's own on tp too (the Rowwise
        # layer's backward needs no tp collective): the rank is named.
        assert ("buddy check (faulty): rank 4's forward/backward of its micro-batch at step 4 "
                "(replay audit) is wrong (its local gradients); ranks 0 and 2 replayed it and "
                "agree") in step4["reason"], step4
    by_step = {int(i.get("step", 0)): i for i in incidents}  # (JSON int64s are strings.)
    assert len(incidents) == 2 and by_step[4].get("ranks") == [4], incidents
    assert by_step[4].get("outcome") == "faulty", incidents
    if layout == "tp":
        # The tp collectives carry rank 1's fault into rank 0's loss too: the
        # replays name the tp group {0, 1}, each rank a suspect.
        why = ("buddy check (suspect): a tp group's replays differed together (replay audit): "
               "ranks 0, 1 (tp mixes activations: no replay tells which is wrong); rank ")
        for rank in range(WORLD):
            reason = steps[rank][1]["reason"]
            assert why in reason, reason  # (Its replayers are cut off at 200 characters.)
            assert "micro-batch at step 2 (replay audit) is wrong (its loss)" in reason, reason
        assert by_step[2].get("outcome") == "suspect", incidents
        assert by_step[2].get("check") == "CHECK_REPLAY", by_step[2]  # Check 2, not 3.
        assert by_step[2].get("ranks") in ([0], [1]), incidents
        # sdcd's incident keeps why no tp rank is named (the engine sends a
        # skipped step's first 200 characters; issue 44, item 5).
        assert why[:why.rindex(";") + 1] in by_step[2]["explanation"], by_step[2]
        return
    for rank in range(WORLD):
        assert ("buddy check (faulty): rank 1's forward/backward of its micro-batch at step 2 "
                "(replay audit) is wrong (its loss); ranks 3 and 5 replayed it and agree"
                ) in steps[rank][1]["reason"], steps[rank][1]
    assert (by_step[2].get("ranks"), by_step[2].get("outcome")) == ([1], "faulty"), incidents


def test_hsdp_checkpoints_are_sharded_kept_provisional_and_resume_bit_identically(
        tmp_path, sdcd):
    # The gate's allowed checkpoints are torch.distributed.checkpoint
    # directories of the sharded state dicts (TrainingState: get_state_dict
    # of the FSDP2 module and its optimizer), provisional until the next one
    # is allowed; a restart restores the newest final one into the shards
    # the guard checks and trains on bit for bit.
    ckpt = tmp_path / "checkpoints"
    env = {"SDC_COORDINATOR": sdcd.trainer_address, "SDC_WEIGHT_CHECK_EVERY": "2"}
    steps, finals = run_job(
        str(tmp_path / "train"), WORLD,
        ["--steps=6", "--checkpoint_every=2", f"--checkpoint_dir={ckpt}"],
        {**env, "SDC_JOB_ID": "hsdp-checkpoints"}, script=SCRIPT)
    for rank in range(WORLD):
        assert [s.get("checkpoint") for s in steps[rank] if s["step"] % 2 == 0] == \
            ["allowed"] * 3, steps[rank]
    assert sorted(os.listdir(ckpt)) == ["step-2.dcp", "step-4.dcp", "step-6.dcp.provisional"]
    assert ".metadata" in os.listdir(ckpt / "step-4.dcp")

    resumed, resumed_finals = run_job(
        str(tmp_path / "resume"), WORLD, ["--steps=6", f"--checkpoint_dir={ckpt}", "--resume"],
        {**env, "SDC_JOB_ID": "hsdp-checkpoints-resumed"}, script=SCRIPT)
    for rank in range(WORLD):
        assert [s["step"] for s in resumed[rank]] == [5, 6], resumed[rank]
        assert [s["loss"] for s in resumed[rank]] == [s["loss"] for s in steps[rank][4:]], rank
        assert resumed_finals[rank]["shard_digest"] == finals[rank]["shard_digest"], rank
    for job in ("hsdp-checkpoints", "hsdp-checkpoints-resumed"):
        assert sdcd.sdcctl("get", "incidents", f"--job={job}")["incidents"] == []


def test_tp_replays_pair_whole_tp_groups_on_other_nodes():
    from sdc_guard import tensor_parallel

    # dp 3 x tp 2, rank = 2 dp + tp, each replica on a node of its own.
    coords = [(r // 2, r % 2) for r in range(6)]
    replayer, third, group = tensor_parallel.pairs(coords, ["a", "a", "b", "b", "c", "c"], 3, 2)
    assert replayer == [2, 3, 4, 5, 0, 1] and third == [4, 5, 0, 1, 2, 3]
    assert group == [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [4, 5]]
    # tp-major numbering (rank = 3 tp + dp): still the same tp coordinate.
    coords = [(r % 3, r // 3) for r in range(6)]
    replayer, third, _ = tensor_parallel.pairs(coords, ["a", "b", "c", "a", "b", "c"], 3, 2)
    assert [coords[replayer[r]][1] for r in range(6)] == [coords[r][1] for r in range(6)]
    assert all(coords[replayer[r]][0] != coords[r][0] for r in range(6))
    # Replica 0 on nodes a and b, replica 1 on b: no partner on other nodes,
    # and then no rank replays (replays off on every rank alike).
    replayer, third, _ = tensor_parallel.pairs([(0, 0), (0, 1), (1, 0), (1, 1)],
                                               ["a", "b", "b", "b"], 2, 2)
    assert replayer == [None] * 4 and third == [None] * 4
    replayer, _, _ = tensor_parallel.pairs([(d, j) for d in range(3) for j in range(2)],
                                           ["a", "b", "b", "c", "d", "d"], 3, 2)
    assert replayer == [None] * 6  # Replicas 0 and 1 share node b.


UNCOVERED = r'''
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import sdc_guard
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
def refused(net):
    try:
        sdc_guard.Guard(net, torch.optim.SGD(net.parameters(), 0.1), lambda m, b: m(b).sum())
    except TypeError as e:
        return str(e)
    return "accepted"
# HSDP whose replicate dim has one rank.
print(refused(fully_shard(torch.nn.Linear(4, 2), mesh=init_device_mesh(
    "cpu", (1, 1), mesh_dim_names=("replicate", "shard")))))
print(refused(torch.nn.Linear(4, 2)))
# Tensor parallel, then FSDP sharding over dp: no replica of any shard.
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
parallelize_module(net, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
print(refused(fully_shard(net, mesh=mesh["dp"])))
dist.destroy_process_group()
'''


def test_layouts_not_covered_are_refused_with_the_reason(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", UNCOVERED, str(tmp_path / "store")], capture_output=True,
        text=True, timeout=120,
        env=python_env({"SDC_JOB_ID": "uncovered", "SDC_NODE_NAME": "node-a"}))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    # (FSDP2 on a 1-D mesh is covered since issue 44 item 3: test_fsdp_buddy.py.)
    assert "the replicate dim has 1 rank" in lines[0] and "shard over a 1-D mesh" in lines[0]
    assert "DistributedDataParallel" in lines[1] and "torch.nn.modules.linear.Linear" in lines[1]
    assert "0 dims of several ranks hold every parameter replicated" in lines[2], lines[2]
    assert "FSDP sharding over dp with tensor parallel leaves no replica" in lines[2], lines[2]


ZERO = r'''
import sys, torch, torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import sdc_guard
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
def attempt(model, opt):
    try:
        sdc_guard.Guard(model, opt, lambda m, b: m(b).sum()).shutdown(0)
        print("accepted")
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
model = DDP(torch.nn.Linear(4, 2))
attempt(model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                       overlap_with_ddp=True))
attempt(model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1))
fsdp = fully_shard(torch.nn.Linear(4, 2), mesh=init_device_mesh("cpu", (1,)))
attempt(fsdp, ZeroRedundancyOptimizer(fsdp.parameters(), optimizer_class=torch.optim.SGD, lr=0.1))
zopt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
part = sdc_guard.buddy.zero_partition(zopt, None)
zopt.param_groups[0]["lr"] = 0.05  # As a scheduler does between steps.
print("settings", part.settings[0]["lr"], zopt.optim.param_groups[0]["lr"], len(part.params))
dist.destroy_process_group()
'''


def test_zero_is_taken_around_ddp_and_refused_where_its_step_cannot_be_checked(tmp_path):
    # ZeRO-1 (a ZeroRedundancyOptimizer around a DDP model) is covered since
    # issue 44 (test_fsdp_buddy.py); overlapped with DDP's hook, or around an
    # FSDP2 module, it is refused with the reason.
    out = subprocess.run(
        [sys.executable, "-c", ZERO, str(tmp_path / "store")], capture_output=True, text=True,
        timeout=120, env=python_env({"SDC_JOB_ID": "zero", "SDC_NODE_NAME": "node-a"}))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4, out.stdout + out.stderr
    assert lines[0].startswith("ValueError optimizer: ZeroRedundancyOptimizer(overlap_with_ddp="
                               "True)"), lines[0]
    assert lines[1] == "accepted", out.stdout + out.stderr
    # One node: the buddy check is off and says why (a buddy must be on another node).
    assert "every rank is on one node" in out.stderr, out.stderr
    assert lines[2].startswith("TypeError optimizer: a ZeroRedundancyOptimizer is covered "
                               "around a DistributedDataParallel model"), lines[2]
    # The buddy's settings are ZeRO's groups, which its step copies into the
    # local optimizer's: a scheduler's change since the last step counts.
    assert lines[3] == "settings 0.05 0.1 2", lines[3]
