"""The package as built: the engine library it loads holds no CPython code
(so one build serves every Python), matches the running torch, refuses a
torch it has no build for, and hands its errors and 64-bit results to
Python as the extension module did."""

import os
import subprocess
import sys

import pytest
import torch

import sdc_guard
from sdc_guard import _C

from conftest import ROOT, python_env

sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import build_wheel  # noqa: E402  (its check of the engine library)


def test_the_engine_library_has_no_cpython_code():
    assert os.path.isfile(_C.LIBRARY)
    assert build_wheel.cpython_uses(_C.LIBRARY) == []


def test_the_engine_is_the_build_for_this_torch():
    major, minor = torch.__version__.split(".")[:2]
    assert os.path.basename(os.path.dirname(_C.LIBRARY)) == f"torch{major}.{minor}"
    assert os.path.commonpath([_C.LIBRARY, sdc_guard.__file__]) == os.path.dirname(sdc_guard.__file__)


def test_a_torch_without_a_build_is_refused_by_name():
    code = "import torch; torch.__version__ = '2.8.1+cu128'; import sdc_guard"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=python_env(), timeout=120)
    assert out.returncode != 0
    major, minor = torch.__version__.split(".")[:2]
    assert "ImportError: sdc_guard has no engine for torch 2.8.1+cu128" in out.stderr, out.stderr
    assert f"torch{major}.{minor}" in out.stderr, out.stderr


def test_invalid_argument_is_a_value_error():
    with pytest.raises(ValueError, match="^2 names for 1 tensors$"):
        _C.model_digest(["a", "b"], [torch.ones(3)])


def test_fingerprints_and_digests_are_unsigned_64_bit():
    t = torch.arange(1000, dtype=torch.float32)
    length, s1, s2 = _C.fingerprint(t)
    assert length == 4000
    assert all(0 <= v < 2**64 for v in (s1, s2))
    assert _C.fingerprint(t.clone()) == (length, s1, s2)
    flipped = t.clone()
    flipped.view(torch.int32)[7] ^= 1
    assert _C.fingerprint(flipped) != (length, s1, s2)
    digests = {_C.model_digest(["w"], [torch.full((4,), float(i))]) for i in range(64)}
    assert len(digests) == 64
    assert all(0 <= d < 2**64 for d in digests)
    # With 64 digests, a signed reading would have put about half below zero.
    assert any(d >= 2**63 for d in digests)


def test_fingerprints_take_the_key_of_a_seed():
    t = torch.arange(1000, dtype=torch.float32)
    fixed = _C.fingerprint(t)
    assert _C.fingerprint(t, seed=0) == fixed  # kernels::kFixedFingerprintSeed
    keyed = _C.fingerprint(t, seed=2**64 - 5)  # Crosses as a negative int.
    assert keyed[0] == fixed[0] and keyed[1:] != fixed[1:]
    assert _C.fingerprint(t.clone(), seed=2**64 - 5) == keyed
    assert _C.fingerprint(t, seed=7) not in (fixed, keyed)
    names, tensors = ["w", "b"], [t, torch.ones(3)]
    assert _C.model_digest(names, tensors, seed=0) == _C.model_digest(names, tensors)
    assert _C.model_digest(names, tensors, seed=2**63) != _C.model_digest(names, tensors)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        _C.fingerprint(t, seed=2**64)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        _C.model_digest(names, tensors, seed=-1)


def test_job_id_from_the_variables():
    assert _C.job_id({"SDC_JOB_ID": "job-7"}) == ("job-7", "SDC_JOB_ID")
