"""A torchrun worker for test_restarts.py: examples/ddp_train.py with what
torchrun cannot give each worker by itself: a node name (two local ranks per
emulated node, as conftest.start_job places them) and a file with this
process's pid (the test kills one rank by it)."""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "ddp_train.py")

local_rank = int(os.environ["LOCAL_RANK"])
os.environ["SDC_NODE_NAME"] = f"node-{chr(ord('a') + local_rank // 2)}"
pid_dir = os.environ.get("RESTART_TEST_PIDS")
if pid_dir:
    name = f"rank-{os.environ['RANK']}-restart-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    with open(os.path.join(pid_dir, name), "w") as f:
        f.write(str(os.getpid()))
sys.argv = [EXAMPLE, *sys.argv[1:]]
sys.path.insert(0, os.path.dirname(EXAMPLE))
runpy.run_path(EXAMPLE, run_name="__main__")
