"""The processes of one run under ``torchrun`` (tensor parallelism): every process decodes, rank 0 alone writes.

Every process must make the same decisions, or their collective forward passes part ways: which questions are
still to do, what the calibration measured, what a stateful drafter restores. Rank 0 decides, from its run
directory and its clocks, and shares the decision; the other ranks compute in a private scratch directory and
write nothing the user sees.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from specbench.errors import SpecbenchError
from specbench.models.placement import world_size as job_size
from specbench.torchrun_errors import record_failure, recorded_failures


@dataclass
class Processes:
    rank: int = 0
    world_size: int = 1
    _group: object = None

    @property
    def primary(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_environment(tp_plan, device: str = "auto") -> Processes:
        """This job's processes as torchrun describes them (one process outside torchrun); starts the process
        group before the model loads, so that transformers' tensor parallelism joins it. ``device`` is
        ``run.device``: the collective backend follows it (gloo for the CPU, NCCL for GPUs)."""
        world_size = job_size()
        if world_size == 1:
            return Processes()
        if tp_plan is None:
            raise SpecbenchError(f"this run has {world_size} processes (torchrun) but model.tp_plan is null: every "
                                 "process would decode the whole model on its own; set model.tp_plan=auto, or run "
                                 "one process without torchrun (engine=vllm shards the model itself: "
                                 "engine.tensor_parallel_size)")
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        distributed = torch.distributed
        if not distributed.is_initialized():
            backend = collective_backend(device, world_size)
            if backend == "nccl":
                torch.cuda.set_device(local_rank)
            # Loading a large model's shards can keep ranks apart for long; the default 10-minute watchdog is short.
            distributed.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                           timeout=timedelta(hours=2))
        # Decisions are Python objects: a gloo group carries them whatever the tensors' backend is.
        group = distributed.new_group(backend="gloo")
        return Processes(rank=distributed.get_rank(), world_size=distributed.get_world_size(), _group=group)

    def run(self, function, *args):
        """``function(*args)``, and under torchrun a failure of one process reaching the others as one line. The
        process that fails records its error where torchrun keeps its error file (``torchrun_errors``: a user
        error as its one line, a bug with its traceback; torchrun's own summary shows it) and fails as it would
        alone; the others, whose collectives fail once it is gone (or whom torchrun stops), raise ``rank R failed:
        <its first line>; see its output`` in place of the collective library's traceback."""
        if self.world_size == 1:
            return function(*args)
        stopped = _stop_with_an_exception()
        try:
            return function(*args)
        except BaseException as error:
            if not _from_a_peer(error):
                record_failure(error)  # a user error as its line, a bug with its traceback
                raise
            raise SpecbenchError(self._peer_failure(error)) from None
        finally:
            if stopped is not None:
                signal.signal(signal.SIGTERM, stopped)

    def _peer_failure(self, error: BaseException) -> str:
        """The one line for a collective that failed because another process is gone: that process's first
        line where it left one (polled briefly: it writes before it exits), else what this process saw."""
        deadline = time.monotonic() + 2.0
        while True:
            for rank, line in recorded_failures():
                if rank != self.rank:
                    return f"rank {rank} of {self.world_size} failed: {line}; see its output"
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        seen = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        return (f"another process of this {self.world_size}-process job stopped ({seen}); see the other processes' "
                "output")

    def share(self, value):
        """Rank 0's ``value``, on every rank (``value`` itself with one process)."""
        if self.world_size == 1:
            return value
        box = [value if self.primary else None]
        torch.distributed.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def decide(self, decision):
        """``decision()`` run by rank 0 and its result shared; a user error it raises is raised on every rank (the
        others would otherwise wait for a decision that never comes)."""
        if self.world_size == 1:
            return decision()
        outcome = None
        if self.primary:
            try:
                outcome = ("ok", decision())
            except SpecbenchError as error:
                outcome = ("error", str(error))
        kind, value = self.share(outcome)
        if kind == "error":
            raise SpecbenchError(value)
        return value


def collective_backend(device: str, world_size: int) -> str:
    """The ``torch.distributed`` backend for ``world_size`` processes on ``run.device``: NCCL with one GPU per
    process, gloo on the CPU. For the CPU, CUDA is hidden from this process first: transformers binds every
    process to the GPU of its LOCAL_RANK whenever torch reports an accelerator (``_bind_local_device``), so on a
    GPU machine a CPU job's second process would ask for a GPU that may not exist ("invalid device ordinal")."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        hide_cuda()
        return "gloo"
    if device != "cuda":
        raise SpecbenchError(f"run.device={device!r} under torchrun: every process takes the GPU of its LOCAL_RANK; "
                             "use run.device=cuda (or auto), or cpu")
    count = torch.cuda.device_count()
    if world_size > count:
        raise SpecbenchError(f"this torchrun job has {world_size} processes, one per GPU, but torch sees {count} "
                             f"GPU(s): use --nproc-per-node {count} or fewer (at least 2), or run.device=cpu")
    return "nccl"


def hide_cuda() -> None:
    """Make this process's torch (and so transformers) see no GPU: CUDA_VISIBLE_DEVICES is read when torch first
    counts the devices, so this holds only while nothing has counted them yet; otherwise one line says how to
    start the job instead."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    accelerator = getattr(torch._C, "_get_accelerator", None)  # what transformers reads
    if torch.cuda.is_available() or (accelerator is not None and accelerator().type == "cuda"):
        raise SpecbenchError("run.device=cpu under torchrun, but torch counted this machine's GPUs before specbench "
                             "could hide them (transformers would bind each process to one); start the job as "
                             "`CUDA_VISIBLE_DEVICES= torchrun ...`")


class JobStopped(SpecbenchError):
    """torchrun stopped this process (SIGTERM), as it does to the others once one process of the job fails."""


def _stop_with_an_exception():
    """SIGTERM raises JobStopped from here on (the previous handler is returned): a process that torchrun stops
    because another one failed says which, instead of vanishing without a word."""
    def stop(signum, frame):
        raise JobStopped("torchrun stopped this process")

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: signals stay as they are
        return None


# Words of gloo's and NCCL's messages for a peer that went away, a connection lost or a collective that timed out.
_PEER_GONE = ("connection closed", "connection reset", "broken pipe", "connection refused", "timed out", "gloo",
              "nccl", "remote process exited", "watchdog")


def _from_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is what a collective raises once another process is gone (or torchrun stopped this one),
    rather than this process's own failure."""
    if isinstance(error, JobStopped):
        return True
    distributed_error = getattr(torch.distributed, "DistError", None)  # torch's family of collective errors
    if distributed_error is not None and isinstance(error, distributed_error):
        return True
    return isinstance(error, RuntimeError) and any(word in str(error).lower() for word in _PEER_GONE)
