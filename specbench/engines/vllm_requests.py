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


class ServedModel:
    """One vLLM engine: ``complete`` one request at a time, ``serve`` many with a number kept in flight."""

    def __init__(self, engine_args: dict, label: str):
        from vllm.engine.arg_utils import AsyncEngineArgs

        self.label = label
        self.loop = asyncio.new_event_loop()
        self._ids = itertools.count()
        args = AsyncEngineArgs(**engine_args)
        self.engine = self.loop.run_until_complete(self._start(args))

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
        start = time.perf_counter()
        tokens, logprobs, times, last = [], [], [], None

        async def consume():
            nonlocal last
            async for output in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                                     request_id=request_id):
                piece = output.outputs[0]
                if piece.token_ids:
                    times.append(time.perf_counter() - start)
                    tokens.extend(piece.token_ids)
                    if piece.logprobs:
                        logprobs.extend(piece.logprobs)
                last = output

        try:
            await asyncio.wait_for(consume(), timeout_s)
        except asyncio.TimeoutError:
            await self.engine.abort(request_id)
            raise RequestTimedOut(f"a request to vLLM ({self.label}) had not finished after {timeout_s:g} s "
                                  f"(engine.request_timeout_s) with {len(tokens)} tokens; it was aborted") from None
        except Exception as error:
            raise _engine_failure(error, self.label) from error
        piece = last.outputs[0]
        spec = piece.spec_decode_metrics.to_dict() if piece.spec_decode_metrics is not None else None
        top = top_arrays(logprobs, params.logprobs) if params.logprobs and len(logprobs) == len(tokens) else None
        return Completion(key, tokens, times[0] if times else 0.0, times[-1] if times else 0.0, spec, top,
                          piece.finish_reason)

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


def _engine_failure(error: Exception, label: str) -> Exception:
    """A failure inside vLLM as one line: its engine process gone, or whatever it said."""
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(error, SpecbenchError):
        return error
    if isinstance(error, EngineDeadError):
        return EngineDied(f"vLLM's engine process ({label}) died while decoding ({_one_line(error)}); nothing of the "
                          "question in flight was written: run the same command again to resume")
    return SpecbenchError(f"vLLM ({label}) failed a request: {_one_line(error)}")


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
