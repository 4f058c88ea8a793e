"""The transformers backend: ``TransformersTarget``, the target as the loop decodes with it, and
``TransformersWeights``, the same model as builders and run.json see it (``specbench.targets.weights``). The
model is one object on one device, its layers spread over several GPUs by accelerate (``device_map``), or one
shard of it per process under transformers' tensor parallelism (``tp_plan``, under ``torchrun``). The sharding is
how the model was loaded; these classes only learn which devices to fence and where inputs and logits live.

Device round trips are a GPU's per-step tax, so a verification pass makes exactly one blocking device-to-host
read (the choices, packed into one block), uploads its inputs from pinned host buffers without blocking, and
builds the attention mask on the device from the [q, q] block that changes (every cached position is visible).
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np
import torch

from specbench.decoding.target import LayerSkip, Target, TargetChoices, VerifyInputs
from specbench.errors import SpecbenchError
from specbench.targets.kernels import OneDNNLinear
from specbench.targets.kv_cache import TreeKVCache
from specbench.targets.weights import TargetWeights

# Choices travel to the host as float32: token ids below 2**24 are exact in it.
_LARGEST_EXACT_ID = 2**24


def cache_keyword(model: torch.nn.Module) -> str:
    """The name under which ``model.forward`` takes the KV cache: ``cache`` from transformers 5.24 on,
    ``past_key_values`` before (those releases silently ignore an unknown ``cache=``)."""
    parameters = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    import transformers
    from packaging.version import Version

    # A wrapper whose forward takes **kwargs only: the installed release's name.
    return "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def forward_with_cache(model: torch.nn.Module, cache, keyword: str | None = None, **inputs):
    """``model(**inputs)`` with ``cache`` passed under the keyword this transformers takes."""
    return model(**inputs, **{keyword or cache_keyword(model): cache}, use_cache=True)


def model_devices(model: torch.nn.Module) -> tuple[torch.device, torch.device, tuple[torch.device, ...]]:
    """(input device, logits device, every device holding a parameter) of a model, wherever it was placed.

    Under accelerate's ``device_map`` the logits are not where the output layer is: the hook on the model itself
    (``io_same_device``) sends every output back to the device its inputs came from, the embeddings' device."""
    devices = sorted({parameter.device for parameter in model.parameters()}, key=str)
    placement = getattr(model, "hf_device_map", None)
    if placement and len(devices) > 1:
        input_device = model.get_input_embeddings().weight.device
        if _outputs_follow_inputs(model):
            return input_device, input_device, tuple(devices)
        return input_device, model.get_output_embeddings().weight.device, tuple(devices)
    return devices[0], devices[0], tuple(devices)


def _outputs_follow_inputs(model: torch.nn.Module) -> bool:
    """Whether an accelerate hook on ``model`` itself returns its outputs to its inputs' device (``dispatch_model``
    adds one; a SequentialHook holds several)."""
    hook = getattr(model, "_hf_hook", None)
    hooks = list(getattr(hook, "hooks", ())) or ([hook] if hook is not None else [])
    return any(getattr(each, "io_same_device", False) for each in hooks)


class NonFiniteLogits(SpecbenchError):
    """A pass whose logits hold NaN or infinity: the model overflowed its dtype (float16 for a model trained in
    bfloat16, say). Every number after it would be meaningless, so the run stops."""

    def __init__(self, dtype: str, rows: int, of: int):
        hint = ("model.dtype=bfloat16 (or float32) avoids float16's overflow" if dtype == "float16"
                else "the checkpoint may be damaged, or the model overflows this dtype")
        super().__init__(f"the target's logits are not finite (NaN or infinity) at {rows} of {of} positions in "
                         f"{dtype}: {hint}")


class _PinnedStaging:
    """Host buffers in page-locked memory, one per role, that uploads copy through without blocking. A buffer
    is reused only after the step's blocking read of the choices, which waits for every earlier copy; so each
    upload of one step has a role of its own (two copies in flight from one buffer would race)."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def stage(self, role: str, array: np.ndarray) -> torch.Tensor:
        flat = torch.from_numpy(np.ascontiguousarray(array)).reshape(-1)
        buffer = self.buffers.get(role)
        if buffer is None or buffer.dtype != flat.dtype or buffer.numel() < flat.numel():
            buffer = torch.empty(max(flat.numel(), 2 * (0 if buffer is None else buffer.numel()), 64),
                                 dtype=flat.dtype).pin_memory()
            self.buffers[role] = buffer
        staged = buffer[: flat.numel()]
        staged.copy_(flat)
        return staged.view(array.shape)


class TransformersTarget(Target):
    """A transformers causal LM (SDPA attention) behind the ``Target`` interface."""

    def __init__(self, model: torch.nn.Module):
        if getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "flash_attention_2"):
            # A boolean 4-D mask means "may attend" to SDPA; eager attention would add it as a bias.
            raise SpecbenchError("the target model must use SDPA attention for tree verification")
        text_config = model.config.get_text_config()
        self.model = model
        self.vocab_size = int(text_config.vocab_size)
        self.num_layers = int(text_config.num_hidden_layers)
        if self.vocab_size > _LARGEST_EXACT_ID:
            raise SpecbenchError(f"a vocabulary of {self.vocab_size} tokens is larger than specbench supports "
                                 f"({_LARGEST_EXACT_ID})")
        self.input_device, self.device, self.devices = model_devices(model)
        self._cuda_devices = tuple(device for device in self.devices if device.type == "cuda")
        self._keyword = cache_keyword(model)
        self._staging = _PinnedStaging() if self.input_device.type == "cuda" else None
        self._cache: TreeKVCache | None = None
        self._mask: torch.Tensor | None = None  # [rows, columns] True, on the input device
        self._hidden_layers: tuple[int, ...] = ()
        self._hidden: torch.Tensor | None = None

    # ---- the sequence --------------------------------------------------------------------------------

    def start(self, capacity: int) -> None:
        self.release()  # whatever the last sequence left (an error inside a pass, say) is not this one's
        self._cache = TreeKVCache(self.num_layers, capacity)

    def release(self) -> None:
        # The mask is dropped with the cache: a pass that failed may have left a nodes' block in it, and a later
        # pass reading those columns would not see cached positions.
        self._cache = None
        self._mask = None
        self._hidden = None

    @property
    def length(self) -> int:
        return 0 if self._cache is None else self._cache.length

    def keep(self, start: int, nodes: list[int]) -> None:
        self._cache.keep_nodes(start, nodes, upload=self._upload_to)

    def truncate(self, length: int) -> None:
        self._cache.truncate(length)

    # ---- forward passes ------------------------------------------------------------------------------

    def prefill(self, prompt_ids: np.ndarray, every_position: bool, top_k: int) -> TargetChoices:
        input_ids = self._upload_to(prompt_ids, self.input_device, "prompt").unsqueeze(0)
        output = self._forward(input_ids=input_ids, logits_to_keep=0 if every_position else 1)
        if output.logits.device != self.device:
            # The loop's random draws, a draft model and the sampling verifier all live on self.device.
            raise SpecbenchError(f"the target's logits came back on {output.logits.device}, but it was set up for "
                                 f"{self.device} (devices {', '.join(map(str, self.devices))}): a placement "
                                 "specbench does not know; please report it")
        return self._choices(output.logits[0], top_k)

    def verify(self, inputs: VerifyInputs, n_nodes: int, top_k: int) -> TargetChoices:
        size = inputs.tokens.size
        input_ids = self._upload_to(inputs.tokens, self.input_device, "tokens").unsqueeze(0)
        position_ids = self._upload_to(inputs.positions, self.input_device, "positions").unsqueeze(0)
        mask = self._attention_mask(inputs.start, self._upload_to(inputs.visible, self.input_device, "visible"))
        try:
            output = self._forward(input_ids=input_ids, position_ids=position_ids, attention_mask=mask)
        finally:
            # Queued after the pass that reads it: the block is all True again for the next step's mask, also
            # when the pass failed (out of memory) and the caller goes on with this target.
            self._mask[:size, inputs.start : inputs.start + size] = True
        return self._choices(output.logits[0, :n_nodes], top_k)

    def skipping_pass(self, tokens: np.ndarray, skip: LayerSkip, after: int | None = None) -> torch.Tensor:
        from specbench.targets.layer_skip import skipped_sublayers, skipping_mask

        size, start = tokens.size, self.length
        first = start if after is None else after
        input_ids = self._upload_to(tokens, self.input_device, "skip_tokens").unsqueeze(0)
        positions = np.arange(first, first + size, dtype=np.int64)
        position_ids = self._upload_to(positions, self.input_device, "skip_positions").unsqueeze(0)
        if after is None:  # a draft token: the device-side mask of the verify passes, its [q, q] block edited in place
            mask = self._attention_mask(start, self._upload_to(np.tril(np.ones((size, size), dtype=bool)),
                                                               self.input_device, "skip_visible"))
        else:  # SWIFT's scoring pass, once a step at most: the cached positions it may not see are masked too
            mask = self._upload_to(skipping_mask(start, size, first), self.input_device, "skip_mask")[None, None]
        layers = self._cache.layers
        try:
            with skipped_sublayers(self.model, skip, lambda layer, count: layers[layer].advance(count)):
                output = forward_with_cache(self.model, self._cache, self._keyword, input_ids=input_ids,
                                            position_ids=position_ids, attention_mask=mask)
        finally:
            if after is None:
                self._mask[:size, start : start + size] = True
        return output.logits[0]

    def _forward(self, **inputs):
        output = forward_with_cache(self.model, self._cache, self._keyword, **inputs,
                                    output_hidden_states=bool(self._hidden_layers))
        if self._hidden_layers:
            self._hidden = torch.stack([output.hidden_states[layer][0].to(self.device)
                                        for layer in self._hidden_layers])
        return output

    def _attention_mask(self, start: int, visible: torch.Tensor) -> torch.Tensor:
        """[1, 1, q, start + q]: all True but the nodes' own [q, q] block, written in place on the device."""
        size = visible.shape[0]
        rows, columns = size, start + size
        if self._mask is None or self._mask.shape[0] < rows or self._mask.shape[1] < columns:
            old = self._mask
            shape = (max(rows, 0 if old is None else old.shape[0]),
                     max(2 * columns, 0 if old is None else old.shape[1]))
            self._mask = torch.ones(shape, dtype=torch.bool, device=self.input_device)
        self._mask[:rows, start:columns] = visible
        return self._mask[:rows, :columns].unsqueeze(0).unsqueeze(0)

    def _choices(self, logits: torch.Tensor, top_k: int) -> TargetChoices:
        """One top-k and one argmax on the device, read back as one block (the step's one blocking read), with a
        column saying whether each row's logits are all finite: a model overflowing its dtype gives NaN logits,
        whose argmax the method and the baseline share, so the lossless check alone would never notice."""
        k = min(max(top_k, 1), logits.shape[-1])  # a vocabulary may be tiny
        top_logits, top_ids = logits.topk(k, dim=-1)
        # topk's order among exactly tied logits is unspecified; argmax gives the first best index.
        argmax = logits.argmax(dim=-1, keepdim=True)
        finite = torch.isfinite(logits).all(dim=-1, keepdim=True)
        block = self._download(torch.cat([top_logits.float(), top_ids.float(), argmax.float(), finite.float()],
                                         dim=-1))
        if not block[:, 2 * k + 1].all():
            raise NonFiniteLogits(self._dtype_name(), int((block[:, 2 * k + 1] == 0).sum()), block.shape[0])
        return TargetChoices(argmax=block[:, 2 * k].astype(np.int64), top_ids=block[:, k : 2 * k].astype(np.int64),
                             top_logits=np.ascontiguousarray(block[:, :k]), logits=logits)

    def _dtype_name(self) -> str:
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    # ---- transfers and the fence ---------------------------------------------------------------------

    def upload(self, array: np.ndarray, role: str = "upload") -> torch.Tensor:
        return self._upload_to(array, self.device, role)

    def _upload_to(self, array: np.ndarray, device: torch.device, role: str = "offsets") -> torch.Tensor:
        """Host array -> tensor on ``device``: a view on a CPU, a non-blocking copy from pinned memory on a GPU."""
        if device.type == "cpu":
            return torch.from_numpy(np.ascontiguousarray(array))
        if self._staging is None:
            return torch.as_tensor(array, device=device)
        return self._staging.stage(f"{role}@{device}", array).to(device, non_blocking=True)

    def _download(self, tensor: torch.Tensor) -> np.ndarray:
        """The one blocking device-to-host read of a pass."""
        return tensor.cpu().numpy()

    def synchronize(self) -> None:
        for device in self._cuda_devices:
            torch.cuda.synchronize(device)

    # ---- hidden states -------------------------------------------------------------------------------

    def request_hidden_states(self, layers: tuple[int, ...]) -> None:
        self._hidden_layers = self.checked_hidden_layers(layers)
        self._hidden = None

    def hidden_states(self, rows: list[int] | None = None) -> torch.Tensor | None:
        if self._hidden is None:
            return None
        if rows is None:
            return self._hidden
        return self._hidden.index_select(1, self.upload(np.asarray(rows, dtype=np.int64), "hidden_rows"))


class TransformersWeights(TargetWeights):
    """A transformers causal LM behind the ``TargetWeights`` interface. ``module`` is the model itself, for the
    code of this backend (its ``Target``, tests comparing with transformers' own decoding)."""

    def __init__(self, module: torch.nn.Module):
        text_config = module.config.get_text_config()
        self.module = module
        self.vocab_size = int(text_config.vocab_size)
        self.num_layers = int(text_config.num_hidden_layers)
        self.hidden_size = int(text_config.hidden_size)
        self.input_device = model_devices(module)[0]
        self._fingerprint: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def parameter_count(self) -> int:
        return parameter_count(self.module)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.module)
        return self._fingerprint

    @property
    def linear_backend_used(self) -> str:
        # onednn when use_linear_backend replaced the linear layers, else PyTorch's own
        return "onednn" if any(isinstance(child, OneDNNLinear) for child in self.module.modules()) else "aten"

    @property
    def architecture(self) -> dict:
        return self.module.config.get_text_config().to_dict()

    def input_embeddings(self) -> torch.Tensor:
        return _whole(self.module.get_input_embeddings().weight)

    def output_layer(self) -> torch.nn.Module:
        layer = self.module.get_output_embeddings()
        weight = getattr(layer, "weight", None)
        if weight is None or not hasattr(weight, "full_tensor"):
            return layer  # a plain or oneDNN-packed linear: called as it is
        # a sharded lm_head wants sharded inputs: a frozen copy of its whole weight instead
        whole = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device,
                                dtype=weight.dtype)
        whole.weight = torch.nn.Parameter(weight.full_tensor().detach(), requires_grad=False)
        return whole

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos_token_ids: frozenset[int], pad_token_id: int, temperature: float | None = None) -> torch.Tensor:
        sampling = ({"do_sample": False} if temperature is None
                    else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0})
        output = self.module.generate(input_ids.to(self.input_device),
                                      attention_mask=attention_mask.to(self.input_device),
                                      max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                                      eos_token_id=sorted(eos_token_ids), **sampling)
        return output[:, input_ids.shape[1]:]

    def hidden_states_and_logits(self, token_ids: torch.Tensor, layers: tuple[int, ...]
                                 ) -> tuple[list[torch.Tensor], torch.Tensor]:
        output = self.module(input_ids=token_ids[None].to(self.input_device), output_hidden_states=True)
        return [output.hidden_states[layer][0] for layer in layers], output.logits[0]

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.module(input_ids=input_ids).logits

    def pruned_copy(self, layers: list[int]) -> torch.nn.Module:
        return prune(self.module, layers)

    def layer_keys_values(self, layer: int) -> torch.nn.Module:
        from specbench.targets.layer_keys import LayerKeysValues

        return LayerKeysValues(self.module, layer)

    def save_checkpoint(self, directory) -> None:
        if self.linear_backend_used != "aten":  # oneDNN's packed layers hold no weight under transformers' names
            raise SpecbenchError("a model whose linear layers run on oneDNN cannot be saved as a checkpoint; load it "
                                 "with linear_backend=aten")
        self.module.save_pretrained(directory)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, as one process has it: under tensor parallelism the weights are shards (DTensors)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def parameter_count(model: torch.nn.Module) -> int:
    """A model's parameters, wherever they are: oneDNN's packed linear weights (buffers) included, a tensor-parallel
    shard counted as its whole tensor."""
    packed = [buffer for name, buffer in model.named_buffers() if name.endswith("packed_weight")]
    return sum(_global_numel(tensor) for tensor in [*model.parameters(), *packed])


def _global_numel(parameter: torch.Tensor) -> int:
    full_shape = getattr(parameter, "shape", None)
    return int(torch.Size(full_shape).numel()) if full_shape is not None else parameter.numel()


def weights_fingerprint(model: torch.nn.Module, samples_per_tensor: int = 4096) -> str:
    """A short hash of a model's weights: every parameter's and buffer's name, shape and dtype, and up to
    ``samples_per_tensor`` of its values at evenly spaced positions. Reading a sample keeps it to milliseconds
    for a 7B model on a GPU; two different checkpoints, seeds or precisions differ in it (damage to a cached
    file is caught by the file checksum, see ``specbench.models.gguf``)."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            tensor = tensor.detach()
            if hasattr(tensor, "full_tensor"):  # a shard under tensor parallelism: the whole tensor, as one process has it
                tensor = tensor.full_tensor()
            if tensor.is_mkldnn:  # weights packed for oneDNN's kernels (run.linear_backend)
                tensor = tensor.to_dense()
            flat = tensor.reshape(-1)
            if flat.numel() > samples_per_tensor:
                # integer steps: float positions round past the end of tensors of tens of millions of values
                flat = flat[torch.arange(samples_per_tensor, device=flat.device) * (flat.numel() - 1) // (samples_per_tensor - 1)]
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            digest.update(flat.to("cpu", torch.float32).numpy().tobytes())
    return digest.hexdigest()[:16]


def dense_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as plain tensors, also for layers running on oneDNN (whose weight is packed)."""
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    for name, module in model.named_modules():
        if isinstance(module, OneDNNLinear):
            state[f"{name}.weight"] = module.packed_weight.to_dense()
    return state


def prune(model: torch.nn.Module, layers: list[int]) -> torch.nn.Module:
    """A new model of the same architecture with only ``layers`` of ``model``'s decoder layers (renumbered
    0..k-1), float32, with trainable standard linear layers."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict())
    text_config = config.get_text_config()
    total = text_config.num_hidden_layers
    text_config.num_hidden_layers = len(layers)
    if getattr(text_config, "layer_types", None):
        text_config.layer_types = [text_config.layer_types[i] for i in layers]
    pruned = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    renumber = {old: new for new, old in enumerate(layers)}
    state = {}
    for name, tensor in dense_state_dict(model).items():
        parts = name.split(".")
        if "layers" in parts:
            position = parts.index("layers") + 1
            old = int(parts[position])
            if old not in renumber:
                continue
            parts[position] = str(renumber[old])
        state[".".join(parts)] = tensor.float()
    missing, unexpected = pruned.load_state_dict(state, strict=False)
    missing = [key for key in missing if not key.endswith("lm_head.weight") or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SpecbenchError(f"pruning a {total}-layer model failed: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return pruned
