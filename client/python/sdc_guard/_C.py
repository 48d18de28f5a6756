"""sdc_guard._C: the C++ engine, for the torch this process runs.

The engine (client/python/engine_library.cc) is a libtorch class library,
built once per torch version and shipped side by side in
``sdc_guard/engines/torch<major>.<minor>/``; it holds no CPython code, so the
same file serves every Python. This module loads the build that matches
``torch.__version__`` (``torch.ops.load_library``), registers the Python side
of the engine's two callbacks, and presents the engine as guard.py uses it:
``Engine``, ``GuardError``, ``job_id``, ``fingerprint``, ``model_digest``,
``check_matmul``.

An engine method is one ``.def`` line in engine_library.cc and needs nothing
here: ``Engine`` forwards every attribute to ``torch.classes.sdc.Engine``,
turning the library's errors into ValueError and GuardError.
"""

import functools
import itertools
import os
import re
import weakref

import torch
import torch.distributed  # noqa: F401  (registers c10d's ProcessGroup class the engine takes)


class GuardError(RuntimeError):
    """sdc-guard could not do what was asked (the message starts with the status code)."""


def _library():
    """The path of the engine built for this process's torch; ImportError
    naming the builds the package has when none matches."""
    engines = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engines")
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    want = f"torch{m.group(1)}.{m.group(2)}" if m else torch.__version__
    path = os.path.join(engines, want, "libsdc_engine.so")
    if not os.path.exists(path):
        have = sorted(os.listdir(engines)) if os.path.isdir(engines) else []
        raise ImportError(
            f"sdc_guard has no engine for torch {torch.__version__}: this installation carries "
            f"builds for {', '.join(have) or 'no torch version'} (see README.md, Status and limits)")
    return path


LIBRARY = _library()
torch.ops.load_library(LIBRARY)

# How engine_library.cc marks its own errors: "sdc_guard:CODE: message".
_MARK = "sdc_guard:"
_U64 = (1 << 64) - 1


def _call(fn, *args):
    """fn(*args), with the engine's errors as ValueError (INVALID_ARGUMENT)
    and GuardError("CODE: message")."""
    try:
        return fn(*args)
    except RuntimeError as e:
        text = str(e)
        if isinstance(e, GuardError) or not text.startswith(_MARK):
            raise
        code, _, message = text[len(_MARK):].partition(": ")
        if code == "INVALID_ARGUMENT":
            raise ValueError(message) from None
        raise GuardError(f"{code}: {message}") from None


# -- the engine's callbacks ------------------------------------------------------
# The engine calls the operators sdc::replay_loss and sdc::optimizer_state with
# its handle; their kernels (registered here once per process) find the
# Engine by that handle. CompositeImplicitAutograd: the loss's graph is
# recorded, and the engine differentiates it.

_engines = {}  # handle -> weakref to Engine
_handles = itertools.count(1)


def _owner(handle):
    engine = _engines.get(handle)
    engine = engine() if engine is not None else None
    if engine is None:
        raise GuardError(f"FAILED_PRECONDITION: engine {handle} is gone")
    return engine


def _replay_loss(handle, batch):
    loss = _owner(handle)._loss_fn(batch)
    if not isinstance(loss, torch.Tensor):
        raise TypeError("sdc_guard: the loss function must return a tensor")
    return loss


def _optimizer_state(handle):
    return list(_owner(handle)._optimizer_state())


_kernels = torch.library.Library("sdc", "IMPL")
_kernels.impl("replay_loss", _replay_loss, "CompositeImplicitAutograd")
_kernels.impl("optimizer_state", _optimizer_state, "CompositeImplicitAutograd")


class Engine:
    """client::GuardEngine for one rank (torch.classes.sdc.Engine).

    Creating it is a collective. ``optimizer_state()`` returns the optimizer's
    tensors, ``loss_fn(batch_tensors)`` a replayed micro-batch's loss; the
    engine calls both on the thread that called it. Every method and
    property of the C++ class is reachable by its name; each call releases
    the GIL for its duration.
    """

    def __init__(self, process_group, param_names, params, buffer_names, buffers,
                 optimizer_state, loss_fn, variables, frozen_names=(), frozen=()):
        self._optimizer_state = optimizer_state
        self._loss_fn = loss_fn
        handle = next(_handles)
        _engines[handle] = weakref.ref(self)
        weakref.finalize(self, _engines.pop, handle, None)
        self._engine = _call(
            torch.classes.sdc.Engine, process_group.boxed(), list(param_names), list(params),
            list(buffer_names), list(buffers), handle, dict(variables), list(frozen_names),
            list(frozen))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._engine, name)
        if not callable(value):  # A property: read at every access.
            return value
        method = functools.partial(_call, value)
        setattr(self, name, method)  # The next call finds it without __getattr__.
        return method


def job_id(variables):
    """(id, source) as the options resolve the job id from ``variables`` and the
    environment, or ("", why) when nothing names it."""
    return tuple(_call(torch.ops.sdc.job_id, dict(variables)))


def _seed(seed):
    """An unsigned 64-bit seed as the library's int (None stays None: the
    fixed seed, which every process shares)."""
    if seed is None:
        return None
    if not 0 <= seed <= _U64:
        raise ValueError(f"a fingerprint seed is an unsigned 64-bit integer, not {seed}")
    return seed - (1 << 64) if seed >> 63 else seed


def fingerprint(tensor, seed=None):
    """The kernels' weight fingerprint of ``tensor`` under the key of ``seed``
    (None: the fixed seed, so separate processes agree; a guarded job uses
    its own): (byte_length, s1, s2)."""
    return tuple(v & _U64 for v in _call(torch.ops.sdc.fingerprint, tensor, _seed(seed)))


def model_digest(names, tensors, seed=None):
    """The model digest sdcd's weight vote compares (an unsigned 64-bit int),
    fingerprints under the key of ``seed`` as in ``fingerprint``."""
    return _call(torch.ops.sdc.model_digest, list(names), list(tensors), _seed(seed)) & _U64


def check_matmul(a, b, c, bias=None, rule="probabilistic", lambda_=10.0):
    """The checksum test of one product ``c = a @ b (+ bias)`` (kernels/abft.h)
    on CPU tensors as stored: (passed, worst column, discrepancy, threshold,
    batch of the worst). ValueError for devices, dtypes or shapes it does
    not take."""
    return tuple(_call(torch.ops.sdc.check_matmul, a, b, c, bias, rule, float(lambda_)))
