"""Requests to one vLLM engine running in this process (vLLM's ``AsyncLLM``, whose engine core runs in a child
process), driven from synchronous code through an event loop of its own. vLLM is imported inside functions here and in
``specbench.engines.vllm``, so importing either module needs no vLLM.

Why ``AsyncLLM`` and not vLLM's OpenAI-compatible server: the same scheduler, batching and speculative decoding
run either way, and in-process the client's clock sees each token as it streams out without HTTP's
serialisation in the figures, while the per-request acceptance counts come back as objects rather than parsed
JSON. Why not the offline ``LLM.generate``: it submits every prompt at once, so a request's time to first token
would include its wait in the queue, which a serving user with that many requests in flight never sees; here a
client keeps exactly ``concurrency`` requests in flight and times each from its own submission.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)


class RequestTimedOut(SpecbenchError):
    """A request that had not finished after ``engine.request_timeout_s`` (it was aborted in the engine)."""


class EngineDied(SpecbenchError):
    """vLLM's engine process is gone (killed, crashed, out of memory)."""


@dataclass
class Completion:
    """One finished request as the client saw it: its tokens, seconds from its submission to its first and
    last token, vLLM's per-request speculative counts (``RequestSpecDecodeMetrics.to_dict()``; None without
    speculation), the top log-probabilities per token ([n, k] ids and values; None when none were asked for) and
    why it stopped (``length``, ``stop``)."""

    key: object
    token_ids: list[int]
    first_token_s: float
    last_token_s: float
    spec: dict | None
    top: tuple[np.ndarray, np.ndarray] | None
    finish_reason: str | None


def top_arrays(logprobs, k: int) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's per-token log-probabilities (a dict token -> Logprob per generated token, the sampled token added
    when it is not among the top k) as [n, k] arrays of ids and values by rank, padded with -1 and -inf. The
    differences between log-probabilities of one position are the differences between its logits, which is what
    the near-tie diagnosis reads."""
    ids = np.full((len(logprobs), k), -1, dtype=np.int64)
    values = np.full((len(logprobs), k), -np.inf, dtype=np.float32)
    for row, entries in enumerate(logprobs):
        ranked = sorted(entries.items(), key=lambda item: item[1].rank if item[1].rank is not None else 1 << 30)
        for column, (token, entry) in enumerate(ranked[:k]):
            ids[row, column] = token
            values[row, column] = entry.logprob
    return ids, values


class StreamedRequest:
    """One request's outputs as they stream from vLLM's ``AsyncLLM.generate`` (``RequestOutputKind.DELTA``: each
    output carries the tokens new since the last), timed by the client's ``clock`` from ``start``, its submission:
    ``first_token_s`` is when the first output with a token arrived, ``last_token_s`` when the last one did."""

    def __init__(self, key, start: float, clock=time.perf_counter):
        self.key, self.start, self.clock = key, start, clock
        self.tokens: list[int] = []
        self.logprobs: list = []
        self.times: list[float] = []  # seconds from submission to each output that carried tokens
        self.last = None

    async def consume(self, outputs) -> None:
        async for output in outputs:
            piece = output.outputs[0]
            if piece.token_ids:
                self.times.append(self.clock() - self.start)
                self.tokens.extend(piece.token_ids)
                if piece.logprobs:
                    self.logprobs.extend(piece.logprobs)
            self.last = output

    def completion(self, top_k: int | None) -> Completion:
        """The finished request; ``top_k``: the log-probabilities asked for per token (None or 0: none)."""
        piece = self.last.outputs[0]
        spec = piece.spec_decode_metrics.to_dict() if piece.spec_decode_metrics is not None else None
        top = top_arrays(self.logprobs, top_k) if top_k and len(self.logprobs) == len(self.tokens) else None
        first, last = (self.times[0], self.times[-1]) if self.times else (0.0, 0.0)
        return Completion(self.key, self.tokens, first, last, spec, top, piece.finish_reason)


def keeping_interrupts(start, undo):
    """``start()``'s result, unless a Ctrl-C (SIGINT) came while it ran: then ``undo(result)`` and KeyboardInterrupt.
    vLLM 0.32 swallows a KeyboardInterrupt raised while its engine starts (``zmq_socket_ctx``,
    vllm/utils/network_utils.py:471-472, wraps the engine's handshake), and would go on with the run; a
    KeyboardInterrupt it lets through goes on as it is. Only in the main thread, where a Python handler of SIGINT
    runs."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        return start()
    came = []

    def noted(signum, frame):
        came.append(signum)
        previous(signum, frame)  # the run's own handler: raises KeyboardInterrupt (or ends the process)

    signal.signal(signal.SIGINT, noted)
    try:
        result = start()
    finally:
        if signal.getsignal(signal.SIGINT) is noted:  # else the handler changed it (a second Ctrl-C now stops)
            signal.signal(signal.SIGINT, previous)
    if came:
        undo(result)
        raise KeyboardInterrupt
    return result


class ServedModel:
    """One vLLM engine: ``complete`` one request at a time, ``serve`` many with a number kept in flight."""

    def __init__(self, engine_args: dict, label: str, explain=None):
        from vllm.engine.arg_utils import AsyncEngineArgs

        self.label = label
        self.explain = explain  # what a failing proposer inside the engine said (vllm_proposer.fault_line), if any
        self.loop = asyncio.new_event_loop()
        self._ids = itertools.count()
        args = AsyncEngineArgs(**engine_args)
        self.engine = keeping_interrupts(lambda: self.loop.run_until_complete(self._start(args)),
                                         lambda engine: engine.shutdown(timeout=15))

    @staticmethod
    async def _start(args):
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(args)

    def sampling_params(self, max_tokens: int, temperature: float, top_p: float, seed: int,
                        stop_token_ids: list[int], top_k_logprobs: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=temperature, top_p=top_p, seed=seed, max_tokens=max_tokens,
                              stop_token_ids=list(stop_token_ids), logprobs=top_k_logprobs or None, detokenize=False,
                              output_kind=RequestOutputKind.DELTA)

    async def _request(self, key, prompt_ids: list[int], params, timeout_s: float) -> Completion:
        from vllm.inputs import TokensPrompt

        request_id = f"{self.label}-{next(self._ids)}"
        stream = StreamedRequest(key, time.perf_counter())
        try:
            await asyncio.wait_for(stream.consume(self.engine.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id=request_id)), timeout_s)
        except asyncio.TimeoutError:
            await self.engine.abort(request_id)
            raise RequestTimedOut(f"a request to vLLM ({self.label}) had not finished after {timeout_s:g} s "
                                  f"(engine.request_timeout_s) with {len(stream.tokens)} tokens; it was aborted"
                                  ) from None
        except Exception as error:
            raise _engine_failure(error, self.label, self.explain() if self.explain else None) from error
        return stream.completion(params.logprobs)

    def complete(self, prompt_ids: list[int], params, timeout_s: float) -> tuple[Completion, float]:
        """One request on its own; returns it and the seconds from its submission to its end."""
        start = time.perf_counter()
        completion = self.loop.run_until_complete(self._request(None, prompt_ids, params, timeout_s))
        return completion, time.perf_counter() - start

    def serve(self, requests: list[tuple[object, list[int], object]], concurrency: int,
              timeout_s: float) -> tuple[list[Completion], float]:
        """Every (key, prompt ids, sampling params) of ``requests``, in order, with ``concurrency`` in flight (a new
        one submitted as one finishes); returns them finished, in order, and the seconds from the first
        submission to the last completion. A request that times out ends the level (``RequestTimedOut``)."""

        async def run():
            slots = asyncio.Semaphore(concurrency)

            async def one(key, ids, params):
                async with slots:
                    return await self._request(key, ids, params, timeout_s)

            tasks = [asyncio.ensure_future(one(*request)) for request in requests]
            try:
                return await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

        self.forget_prefixes()  # each level prefills its prompts as a first visit does, not from an earlier level
        start = time.perf_counter()
        completions = self.loop.run_until_complete(run())
        return list(completions), time.perf_counter() - start

    def forget_prefixes(self) -> None:
        """Empty vLLM's prefix cache (on by default), so that prompts an earlier measurement or the warm-up sent
        are prefilled again rather than read from it."""
        self.loop.run_until_complete(self.engine.reset_prefix_cache())

    def shutdown(self) -> None:
        """Stop the engine's processes and close the loop, its pending tasks cancelled first (so that nothing
        complains of a closed loop at exit)."""
        try:
            self.engine.shutdown(timeout=15)  # room for its workers to exit on their own (else it kills them at 5 s)
            self.engine = None  # AsyncLLM.__del__ would shut it down again while the interpreter exits
            import gc

            gc.collect()
        finally:
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()


def _engine_failure(error: Exception, label: str, reason: str | None = None) -> Exception:
    """A failure inside vLLM as one line: its engine process gone, or whatever it said; ``reason``: what a proposer
    that failed inside it wrote (its own line says why better than vLLM's)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(error, SpecbenchError):
        return error
    if isinstance(error, EngineDeadError) or reason is not None:
        why = reason or _one_line(error)
        return EngineDied(f"vLLM's engine process ({label}) died while decoding ({why}); nothing of the "
                          "question in flight was written: run the same command again to resume")
    return SpecbenchError(f"vLLM ({label}) failed a request: {_one_line(error)}")


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
