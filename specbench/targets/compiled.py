"""The compiled regime (``run.regime=compiled``): the same transformers model, its verification passes compiled by
``torch.compile`` (inductor) once per shape, over a KV cache that never moves (``static_cache.StaticTreeCache``);
on a CUDA device each shape's pass is also captured as a CUDA graph (``graphs.CudaGraphs``; with
``run.compile_mode=none`` the eager kernels alone), over the whole cache buffer, and a pass is one replay.

Why: run eagerly, a pass of a small model is one Python call per kernel, and the cost of verifying q tokens
against one, t(q)/t(1), is then the interpreter's and the kernel library's (on a 2-core CPU, 2 tokens cost 1.45x
one where the weights are read once either way). Compiled, a pass is a few fused C++ loops between the matrix
products, so the curve is much closer to the machine's.

How, so that nothing is compiled while a question is timed:

- shapes: a pass of q tokens runs at the smallest of ``buckets`` that holds it (one compiled shape each); the
  extra rows are padding that nothing attends to and whose outputs are dropped, as ``run.verify_padding`` pads;
- the cache: sized once (``prepare``: the run's longest sequence plus the largest bucket, rounded up to
  CAPACITY_STEP tokens); a pass writes at positions held in a device tensor and attends over the whole buffer
  through a mask built inside the graph, so no position, length or address is a constant of the graph;
- attention: for a grouped-query model (SmolLM2, Llama-3, Qwen) the query heads that share a key/value head are
  folded into rows of one attention (``folded_gqa_attention``) instead of transformers' copy of the keys and values
  for every query head, which its SDPA path makes whenever a mask is given (and, compiled, even for one token);
- every bucket is compiled in ``prepare`` (the untimed warm-up, with a progress bar), and from then on a pass
  that would compile again is refused (``torch.compiler.set_stance("fail_on_recompile")``): a timed pass
  never hides a compile, and never falls back to eager;
- the prompt's prefill runs eagerly (its length varies per question), on the same cache, as does a pass of
  more tokens than the largest bucket holds (refused: ``check``).

inductor keeps what it compiled in ``$SPECBENCH_CACHE/compiled/inductor`` (unless TORCHINDUCTOR_CACHE_DIR says
otherwise), so a second run reads its graphs instead of compiling them. The weights are not frozen into the graphs:
on a 2-core Xeon (2026-12-05) freezing with oneDNN's weight packing and the C++ GEMM templates gave no faster pass
(the embedded model's one-token pass 24.2 ms frozen and autotuned, 22.9 ms neither), and a frozen graph holds
oneDNN tensors that inductor cannot cache, so every run compiled every shape again (45 s each).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from specbench.decoding.target import LayerSkip, TargetChoices, VerifyInputs
from specbench.errors import SpecbenchError
from specbench.settings import COMPILE_BUCKETS, COMPILE_MODES, NO_COMPILE_ON_A_CPU, check_compile_buckets
from specbench.targets.graphs import Captured, CudaGraphs
from specbench.targets.kernels import OneDNNLinear
from specbench.targets.static_cache import StaticTreeCache
from specbench.targets.transformers import TransformersTarget, forward_with_cache

log = logging.getLogger(__name__)

CAPACITY_STEP = 256  # the cache's capacity is a multiple of it: a few sizes, each compiled once and cached
REGIME = "compiled"
NO_COMPILE = "none"  # run.compile_mode on a GPU: the eager kernels captured in CUDA graphs, nothing compiled


FOLDED_ATTENTION = "specbench_folded_gqa"  # the name the compiled passes' attention is registered under


def folded_gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                         **kwargs):
    """SDPA for a grouped-query layer without copying its keys and values: the ``groups`` query heads that share
    a key/value head become ``groups`` times as many query rows of that head (the mask's rows repeated to match),
    the same products in another order. transformers' ``sdpa_attention_forward`` instead repeats the keys and values
    for every query head whenever a mask is given and q > 1 (under torch.compile, also for q = 1): over the compiled
    regime's whole cache that copy is a tenth of a pass of the embedded model (q = 8: 35.7 ms, folded 32.0)."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, length, _ = query.shape
    if groups > 1:
        query = query.reshape(batch, heads // groups, groups * length, query.shape[-1])
        if attention_mask is not None:
            mask_batch, mask_heads, _, columns = attention_mask.shape
            attention_mask = attention_mask[:, :, None].expand(mask_batch, mask_heads, groups, length, columns)
            attention_mask = attention_mask.reshape(mask_batch, mask_heads, groups * length, columns)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                              dropout_p=dropout, scale=scaling)
    return output.reshape(batch, heads, length, value.shape[-1]).transpose(1, 2).contiguous(), None


class CompileFailed(SpecbenchError):
    """torch.compile could not compile the target's pass, or a pass needed a compile after the warm-up.
    ``in_backend``: inductor's compile itself failed (``cause`` its first line), which a damaged cache can cause."""

    def __init__(self, message: str, in_backend: bool = False, cause: str = ""):
        super().__init__(message)
        self.in_backend = in_backend
        self.cause = cause


# The first transformers release whose models take the cache as ``cache=`` and no longer derive positions from its
# length (``cache.get_seq_length()``, a Python int, so a graph compiled over it is recompiled at every pass: under
# 5.0 each pass hit dynamo's recompile limit).
FIRST_COMPILABLE = (5, 24)


def compilable_transformers() -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__).release >= FIRST_COMPILABLE


def bucket_for(size: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``size`` tokens; a SpecbenchError when none does."""
    for bucket in buckets:
        if bucket >= size:
            return bucket
    raise SpecbenchError(f"a pass of {size} tokens is larger than the largest compiled shape ({buckets[-1]}); "
                         f"add a larger bucket to run.compile_buckets or lower run.max_draft_tokens")


def round_up(count: int, step: int = CAPACITY_STEP) -> int:
    return -(-int(count) // step) * step


def padded_inputs(inputs: VerifyInputs, bucket: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``inputs`` padded to ``bucket`` tokens: pad tokens 0 at the last node's position, each seeing only itself
    (and the cached prefix, as every row does), and seen by no real node, so the real nodes' outputs are those of
    the unpadded pass."""
    size = inputs.tokens.size
    tokens = np.zeros(bucket, dtype=np.int64)
    tokens[:size] = inputs.tokens
    positions = np.full(bucket, inputs.positions[size - 1], dtype=np.int64)
    positions[:size] = inputs.positions
    visible = np.eye(bucket, dtype=bool)
    visible[:size, :size] = inputs.visible
    return tokens, positions, visible


class CompiledTarget(TransformersTarget):
    """A transformers causal LM whose verification passes run compiled (see the module's docstring).

    buckets: the pass sizes compiled, ascending, 1 first (``run.compile_buckets``).
    mode:    torch.compile's mode (``run.compile_mode``): ``default``, or ``max-autotune-no-cudagraphs``, which
             times inductor's matrix-product templates against the library's kernels for each shape (without frozen
             weights the library's won on a 2-core Xeon: no faster pass, a slower compile); on a GPU also ``none``:
             no torch.compile, the eager kernels captured as they are.
    graphs:  what captures each shape's pass on a GPU (``graphs.CudaGraphs``, the default there; None on a CPU,
             where inductor's C++ is the compiled pass); ``graphs.HostReplay`` checks a GPU run's path on a CPU.
    """

    regime = REGIME

    def __init__(self, model: torch.nn.Module, buckets=tuple(COMPILE_BUCKETS), mode: str = "default", graphs=None):
        super().__init__(model)
        self.buckets = check_compile_buckets(buckets)
        if mode not in COMPILE_MODES:
            raise SpecbenchError(f"run.compile_mode={mode!r} is not known; choose one of {', '.join(COMPILE_MODES)}")
        if len(self.devices) > 1 or self.device.type not in ("cpu", "cuda"):
            where = ", ".join(map(str, self.devices))
            raise SpecbenchError(f"run.regime=compiled runs a target on one CPU or one CUDA GPU, not on {where} "
                                 "(a graph per bucket spans one device); run.regime=eager runs it there")
        if graphs is None and self.device.type == "cuda":
            graphs = CudaGraphs(self.device)
        if mode == NO_COMPILE and graphs is None:
            raise SpecbenchError(NO_COMPILE_ON_A_CPU)
        self.graphs = graphs
        if not compilable_transformers():
            import transformers

            raise SpecbenchError(f"run.regime=compiled needs transformers {'.'.join(map(str, FIRST_COMPILABLE))} or "
                                 f"later, not {transformers.__version__}: earlier releases count a pass's positions "
                                 "from the cache's length, a new constant of the compiled graph at every pass; "
                                 "run.regime=eager runs it")
        if any(isinstance(module, OneDNNLinear) for module in model.modules()):
            raise SpecbenchError("run.regime=compiled needs the model's own linear layers (run.linear_backend=auto "
                                 "or aten): torch.compile cannot trace oneDNN's packed ones, and packs the weights "
                                 "itself")
        self.mode = mode
        self.compile_seconds: dict[str, float] = {}  # per compiled shape, for the run's record
        self.shapes_from_cache: set[str] = set()  # those whose graph inductor read from its cache
        self._passes: dict[tuple[int, ...], Callable] = {}  # per hidden-state layers: the compiled pass
        self._eager_passes: dict[tuple[int, ...], Callable] = {}
        self._shapes: set[tuple[int, tuple[int, ...]]] = set()  # (bucket, layers) compiled over this cache
        self._frozen = False  # after prepare: a pass that would compile is refused
        self._captured: dict[tuple[int, tuple[int, ...]], Captured] = {}  # on a GPU: each shape's graph
        self.graph_memory_bytes: int | None = None  # what capturing took on the device
        self._static: StaticTreeCache | None = None
        _configure_compiler()

    # ---- the sequence --------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return 0 if self._static is None else self._static.capacity

    def prepare(self, longest_sequence: int, largest_pass: int, hidden_layers: list[tuple[int, ...]],
                progress=None) -> None:
        """Size the cache for ``longest_sequence`` tokens and compile every bucket up to the one of
        ``largest_pass`` tokens, for each of ``hidden_layers`` (the layer sets the run's decodes ask for, () for
        none); from then on a pass that would compile is refused. ``progress``: a tqdm-like factory."""
        largest = bucket_for(largest_pass, self.buckets)
        self.buckets = tuple(bucket for bucket in self.buckets if bucket <= largest)
        self._ensure_capacity(longest_sequence)
        shapes = [(bucket, tuple(layers)) for layers in dict.fromkeys(map(tuple, hidden_layers))
                  for bucket in self.buckets]
        if self.graphs is None:
            log.info("run.regime=compiled: compiling %d pass shapes (%s tokens) for a cache of %d tokens: on 2 CPU "
                     "cores about half a minute each for a 135M model the first time (%s mode), seconds once %s holds "
                     "them", len(shapes), ",".join(map(str, self.buckets)), self.capacity, self.mode,
                     os.environ["TORCHINDUCTOR_CACHE_DIR"])
        else:
            log.info("run.regime=compiled: capturing %d pass shapes (%s tokens) as CUDA graphs over a cache of %d "
                     "tokens (%s): %s", len(shapes), ",".join(map(str, self.buckets)), self.capacity,
                     "the eager kernels" if self.mode == NO_COMPILE else f"torch.compile's {self.mode} mode inside",
                     "seconds each" if self.mode == NO_COMPILE else "a minute or more each the first time, "
                     f"seconds once {os.environ['TORCHINDUCTOR_CACHE_DIR']} holds them")
        self._compile(shapes, progress)
        self._frozen = True

    def start(self, capacity: int) -> None:
        self.release()
        self._ensure_capacity(capacity)

    def release(self) -> None:
        # The buffers stay (their addresses are the compiled graphs'); what they hold is masked out from now on.
        if self._static is not None:
            self._static.set_length(0)
        self._cache = self._static
        self._hidden = None

    def _ensure_capacity(self, tokens: int) -> None:
        """A cache of at least ``tokens`` plus the largest bucket; a larger one than the last means new shapes,
        compiled here, before the sequence's clock starts."""
        needed = tokens + self.buckets[-1]
        if self._static is not None and needed <= self._static.capacity:
            return
        shapes = sorted(self._shapes)
        if self._static is not None:
            log.warning("the compiled target's cache of %d tokens is too small for a sequence of %d; it grows to %d "
                        "and its %d pass shape(s) compile again (untimed)", self._static.capacity, tokens,
                        round_up(needed), len(shapes))
        # Plain tensors, not inference-mode ones (which nothing outside inference mode may write): the buffers
        # outlive whichever mode this was called in.
        with torch.inference_mode(False), torch.no_grad():
            self._static = StaticTreeCache(self.num_layers, round_up(needed), self.input_device)
            self._cache = self._static
            self._passes.clear()
            self._eager_passes.clear()
            self._captured.clear()  # their addresses were the old buffers'
            self._shapes.clear()
            self._static.attend(1)
            self._eager_pass(())(*self._tensors(np.zeros(1, np.int64), np.zeros(1, np.int64),
                                                np.ones((1, 1), bool)))  # allocates every layer's buffers
            self._static.set_length(0)
        if shapes:
            frozen, self._frozen = self._frozen, False
            self._compile(shapes, None)
            self._frozen = frozen

    # ---- forward passes ------------------------------------------------------------------------------

    def prefill(self, prompt_ids: np.ndarray, every_position: bool, top_k: int) -> TargetChoices:
        size = prompt_ids.size
        start = self.length
        visible = np.tril(np.ones((size, size), dtype=bool))
        self._static.attend(start + size)
        logits, hidden = self._eager_pass(self._hidden_layers)(
            *self._tensors(prompt_ids, np.arange(start, start + size), visible),
            logits_to_keep=0 if every_position else 1)
        self._static.set_length(start + size)
        self._hidden = hidden
        return self._choices(logits, top_k)

    def verify(self, inputs: VerifyInputs, n_nodes: int, top_k: int) -> TargetChoices:
        size = inputs.tokens.size
        bucket = bucket_for(size, self.buckets)
        if inputs.start + bucket > self.capacity:
            raise SpecbenchError(f"a pass at position {inputs.start} of {bucket} tokens overruns the compiled "
                                 f"target's cache of {self.capacity}: start() was asked for too little")
        self._static.set_length(inputs.start)
        self._static.attend(self._attended(inputs.start + bucket))
        tensors = self._tensors(*padded_inputs(inputs, bucket))
        logits, hidden = self._run(bucket, self._hidden_layers, tensors)
        self._static.set_length(inputs.start + size)
        self._hidden = None if hidden is None else hidden[:, :size]
        return self._choices(logits[:n_nodes], top_k)

    def skipping_pass(self, tokens: np.ndarray, skip: LayerSkip, after: int | None = None) -> torch.Tensor:
        """Eager, as the prefill: a draft's passes grow one token at a time and leave sublayers out, shapes no
        compiled graph has; the compiled passes stay the verifications'. A skipped attention writes nothing, and
        the fixed buffers need no placeholder (one length for every layer)."""
        from specbench.targets.layer_skip import skipped_sublayers, skipping_mask

        size, start = tokens.size, self.length
        first = start if after is None else after
        if start + size > self.capacity:
            raise SpecbenchError(f"a draft pass at position {start} of {size} tokens overruns the compiled target's "
                                 f"cache of {self.capacity}: start() was asked for too little")
        self._static.set_length(start)
        self._static.attend(start + size)
        input_ids, position_ids, _ = self._tensors(tokens, np.arange(first, first + size), np.ones((1, 1), bool))
        mask = self._upload_to(skipping_mask(start, size, first), self.input_device, "skip_mask")[None, None]
        with skipped_sublayers(self.model, skip):
            output = forward_with_cache(self.model, self._static, self._keyword, input_ids=input_ids,
                                        position_ids=position_ids, attention_mask=mask)
        self._static.set_length(start + size)
        return output.logits[0]

    def _tensors(self, tokens: np.ndarray, positions: np.ndarray, visible: np.ndarray):
        return (self._upload_to(np.asarray(tokens, np.int64), self.input_device, "tokens").unsqueeze(0),
                self._upload_to(np.asarray(positions, np.int64), self.input_device, "positions").unsqueeze(0),
                self._upload_to(np.asarray(visible, bool), self.input_device, "visible"))

    def _attended(self, filled: int) -> int:
        """The columns a pass attends over when ``filled`` of them are written: just those for inductor's graphs
        (their column count is dynamic), the whole buffer for a captured graph (which has one shape)."""
        return self.capacity if self.graphs is not None else filled

    def _run(self, bucket: int, layers: tuple[int, ...], tensors):
        if self.graphs is not None:
            if not self._frozen and (bucket, layers) not in self._captured:  # before prepare: captured on first use
                self._capture(bucket, layers, tensors)
            return self._replay(bucket, layers, tensors)
        compiled = self._compiled_pass(layers)
        if not self._frozen:
            self._shapes.add((bucket, layers))
            with self._folded_attention():
                return _compiling(lambda: compiled(*tensors), self.model)
        if (bucket, layers) not in self._shapes:
            raise CompileFailed(f"a pass of {bucket} tokens{_with_layers(layers)} was not compiled in the warm-up; "
                                "please report it")
        try:
            with torch.compiler.set_stance("fail_on_recompile"), self._folded_attention():
                return compiled(*tensors)
        except RuntimeError as error:
            if "recompile" not in str(error).lower():
                raise
            raise CompileFailed(f"a pass of {bucket} tokens{_with_layers(layers)} needed a new compile after the "
                                f"warm-up ({_first_line(error)}); a compiled run never times a compile: please "
                                "report it") from None

    def _replay(self, bucket: int, layers: tuple[int, ...], tensors):
        if (bucket, layers) not in self._captured:
            raise CompileFailed(f"a pass of {bucket} tokens{_with_layers(layers)} was not captured in the warm-up; "
                                "please report it")
        logits, hidden = self._captured[bucket, layers].replay(*tensors)
        return logits, None if hidden is None else hidden.clone()  # the drafter reads it after the next replay

    def captured_passes(self) -> list[Captured]:
        """The captured graph of each prepared shape (none on a CPU), for the GPU check's replays."""
        return list(self._captured.values())

    def _capture(self, bucket: int, layers: tuple[int, ...], tensors) -> None:
        """Capture the pass of (bucket, layers) over the graph's own copies of ``tensors``."""
        run = self._eager_pass(layers) if self.mode == NO_COMPILE else self._compiled_pass(layers)

        def folded(*inputs):
            with self._folded_attention():
                return run(*inputs)

        inputs = tuple(tensor.clone() for tensor in tensors)
        try:
            self._captured[bucket, layers] = _compiling(lambda: self.graphs.capture(folded, inputs), self.model)
        except torch.OutOfMemoryError as error:
            raise CompileFailed(f"run.regime=compiled: out of GPU memory capturing the pass of {bucket} tokens "
                                f"({_first_line(error)}); fewer or smaller run.compile_buckets, or a shorter "
                                "sequence (run.max_new_tokens), need less") from None
        except RuntimeError as error:
            if "captur" not in str(error).lower():
                raise
            name = getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__
            raise CompileFailed(f"run.regime=compiled: {name}'s pass of {bucket} tokens cannot be captured in a CUDA "
                                f"graph ({_first_line(error)}): something in it waits for the host; run.regime=eager "
                                "runs it") from None
        self._shapes.add((bucket, layers))

    @contextlib.contextmanager
    def _folded_attention(self):
        """The model's attention is ``folded_gqa_attention`` while a compiled pass runs (and is traced, so the
        graphs hold it); the eager prefill keeps transformers' SDPA, as the eager regime runs it."""
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = FOLDED_ATTENTION
        try:
            yield
        finally:
            config._attn_implementation = previous

    def _compile(self, shapes: list[tuple[int, tuple[int, ...]]], progress) -> None:
        """Compile every (bucket, layers) shape of ``shapes``. When inductor fails, its cache may be what is broken
        (a truncated kernel module or library, which inductor imports rather than rebuilds): the cache is set aside
        and every shape compiled again from nothing, once; a second failure is the model's or the compiler's."""
        try:
            self._compile_shapes(shapes, progress)
        except CompileFailed as failure:
            if not failure.in_backend:
                raise
            aside = set_aside(compiled_cache_location())
            log.warning("run.regime=compiled: inductor failed over its cache (%s); the cache may be damaged: it is "
                        "set aside as %s and every pass shape compiles again from nothing", failure.cause, aside)
            torch._dynamo.reset()  # forget what was compiled from the old cache, and the failure
            self._passes.clear()
            self._captured.clear()
            self._shapes.clear()
            try:
                self._compile_shapes(shapes, progress)
            except CompileFailed as again:
                raise CompileFailed(f"{again} (also with an empty cache, so not because of the one set aside as "
                                    f"{aside})") from None

    def _compile_shapes(self, shapes: list[tuple[int, tuple[int, ...]]], progress) -> None:
        """One dummy pass per (bucket, layers) shape, over position 1 of the cache, which compiles it."""
        if self.graphs is not None:  # the largest first: the smaller ones' temporaries fit in the memory it took
            shapes = sorted(shapes, key=lambda shape: -shape[0])
        what = "capturing the target's passes" if self.graphs is not None else "compiling the target's passes"
        bar = progress(shapes, desc=what, unit="shape") if progress else shapes
        warmed: set[tuple[int, ...]] = set()
        with torch.inference_mode():
            for bucket, layers in bar:
                began = time.perf_counter()
                self._static.set_length(1)
                self._static.attend(self._attended(1 + bucket))
                inputs = VerifyInputs(tokens=np.zeros(bucket, np.int64), positions=np.arange(1, bucket + 1),
                                      visible=np.tril(np.ones((bucket, bucket), dtype=bool)), start=1)
                hits = _cache_hits()
                tensors = self._tensors(*padded_inputs(inputs, bucket))
                if layers and layers not in warmed:
                    # transformers installs its hidden-state hooks under a threading lock on the first pass that
                    # asks for them, which dynamo cannot trace: that first pass runs eagerly, here
                    self._eager_pass(layers)(*tensors)
                    warmed.add(layers)
                if self.graphs is not None:
                    self._capture(bucket, layers, tensors)
                else:
                    self._run(bucket, layers, tensors)
                shape = f"{bucket}{_with_layers(layers)}"
                self.compile_seconds[shape] = round(time.perf_counter() - began, 2)
                if _cache_hits() > hits:
                    self.shapes_from_cache.add(shape)
            self._static.set_length(0)
        if self.graphs is not None:
            self.graph_memory_bytes = self.graphs.memory_bytes()

    def _compiled_pass(self, layers: tuple[int, ...]) -> Callable:
        if layers not in self._passes:
            self._passes[layers] = torch.compile(self._eager_pass(layers), dynamic=False, fullgraph=True,
                                                 mode=None if self.mode == "default" else self.mode)
        return self._passes[layers]

    def _eager_pass(self, layers: tuple[int, ...]) -> Callable:
        """The pass as a function of (tokens [1, q], positions [1, q], visible [q, q]) over the cache's columns
        (``StaticTreeCache.attend``): the [q, columns] mask built from the cache's write position inside it, so
        that no position is a constant of a compiled graph."""
        if layers in self._eager_passes:
            return self._eager_passes[layers]
        model, cache, keyword = self.model, self._static, self._keyword

        def target_pass(input_ids, position_ids, visible, logits_to_keep: int = 0):
            size = input_ids.shape[1]
            slots = cache.write_at + torch.arange(size, device=input_ids.device)
            mask = (cache.columns < cache.write_at).unsqueeze(0).expand(size, -1).clone()
            mask.index_copy_(1, slots, visible)
            output = forward_with_cache(model, cache, keyword, input_ids=input_ids, position_ids=position_ids,
                                        attention_mask=mask[None, None], logits_to_keep=logits_to_keep,
                                        output_hidden_states=bool(layers))
            hidden = torch.stack([output.hidden_states[layer][0] for layer in layers]) if layers else None
            return output.logits[0], hidden

        self._eager_passes[layers] = target_pass
        return target_pass


def _configure_compiler() -> None:
    """dynamo and inductor as the compiled regime needs them, for the whole process (their settings are
    process-wide): enough recompiles of the one pass function for every bucket, and an error past them rather
    than dynamo's quiet eager fallback; the compiled graphs cached under specbench's cache unless
    TORCHINDUCTOR_CACHE_DIR names another place. The attention function the passes use is registered with
    transformers."""
    from transformers import AttentionInterface

    AttentionInterface.register(FOLDED_ATTENTION, folded_gqa_attention)
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    dynamo_config.fail_on_recompile_limit_hit = True
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compiled_cache_location())


def compiled_cache_location() -> Path:
    """Where the compiled regime keeps inductor's kernels: TORCHINDUCTOR_CACHE_DIR when the user set it, else
    ``compiled/inductor`` under specbench's cache."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from specbench.storage.cache import cache_root

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # inductor writes its default into the variable once it has looked: that one is not the user's choice.
    if chosen in (None, "", os.path.abspath(default_cache_dir())):
        return compile_cache_dir(cache_root(None))
    return Path(chosen)


def compile_cache_dir(root: Path) -> Path:
    """Where inductor keeps the compiled regime's kernels under specbench's cache ``root``."""
    return root / "compiled" / "inductor"


def _compiling(call: Callable, model: torch.nn.Module):
    """``call()``, where torch.compile's own failures (a graph break, an operation inductor cannot lower, a
    compiler error) become one line naming the model and the cause."""
    import torch._dynamo.exc as dynamo_errors

    try:
        return call()
    except (dynamo_errors.Unsupported, dynamo_errors.BackendCompilerFailed, dynamo_errors.TorchRuntimeError,
            dynamo_errors.InternalTorchDynamoError, dynamo_errors.FailOnRecompileLimitHit) as error:
        name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        cause = f"{type(error).__name__}: {_backend_cause(error)}"
        raise CompileFailed(f"run.regime=compiled: torch.compile cannot compile {name}'s pass ({cause}); "
                            "run.regime=eager runs it", in_backend=isinstance(error, dynamo_errors.BackendCompilerFailed),
                            cause=cause) from None


def _cache_hits() -> int:
    """How many graphs inductor and AOTAutograd have read from their caches in this process so far."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]


def _backend_cause(error: BaseException) -> str:
    """The first line of ``error`` that says something: inductor's BackendCompilerFailed opens with "backend=
    'inductor' raised:" and names the cause on the next line."""
    lines = [" ".join(line.split()) for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("backend=") and lines[0].endswith("raised:"):
        lines = lines[1:]
    return (lines[0][:300] if lines else "") or type(error).__name__


def set_aside(directory: Path) -> Path:
    """Move ``directory`` to ``<directory>.damaged`` (replacing an earlier one), keeping it for a bug report
    rather than deleting what may be a directory the user chose; return where it went."""
    import shutil

    aside = directory.with_name(directory.name + ".damaged")
    if aside.exists():
        shutil.rmtree(aside, ignore_errors=True)
    if directory.exists():
        directory.rename(aside)
    return aside


def _with_layers(layers: tuple[int, ...]) -> str:
    return f" with the hidden states of layers {','.join(map(str, layers))}" if layers else ""


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split("\n", 1)[0].split())
    return text[:300] or type(error).__name__
