"""The regular checkpoint a GGUF file is converted (dequantized) into on its first load, cached by the file's
content and the transformers version, so later loads read that copy in well under a second."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from specbench.artefacts.base import Artefact
from specbench.errors import SpecbenchError
from specbench.storage import manifest
from specbench.storage.atomic import write_atomically
from specbench.storage.manifest import verify_files
from specbench.storage.publish import replace_directory, require_writable

log = logging.getLogger(__name__)


# storage.publish.replace_directory's record of every file (size, modification time, SHA-256), written last.
CHECKSUM_FILE = "manifest.json"
CACHE_HINT = "set SPECBENCH_CACHE (or model.cache_dir) to a writable directory"


# Measured on 2 cores: SmolLM2-135M's 98 MB Q4_1 file converts in about 20 s (conf/model/smollm2-135m.yaml).
SECONDS_PER_GGUF_BYTE = 20.0 / 98e6


def convert_gguf(file: Path, converted: Path, torch_dtype) -> None:
    """Dequantize the GGUF ``file`` into a regular checkpoint at ``converted``, through
    ``storage.publish.replace_directory``: written to a staging directory, every file's checksum recorded last, then
    renamed into place, so that a killed conversion never leaves a copy that looks complete."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require_writable(converted, CACHE_HINT)  # before the tens of seconds of dequantizing
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch_dtype)
    # save_pretrained refuses a model that still claims to be quantized; the weights are dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # A full or read-only cache disk is one line naming the copy (replace_directory maps safetensors' own error
    # too) and leaves no staging directory behind.
    replace_directory(converted, lambda staging: (model.save_pretrained(staging), tokenizer.save_pretrained(staging)),
                      {"gguf": str(file), "dtype": str(torch_dtype)})


def gguf_digest(file: Path, models: Path) -> str:
    """The SHA-256 of ``file``'s content, which names its converted copies: the same file installed again (a fresh
    clone's own venv gives the embedded model's file a new modification time) reuses them instead of converting for
    tens of seconds, and an edited file is converted again. Remembered under ``models``/.gguf-digests by the file's
    path, size, modification and change time, so that a later load hashes nothing."""
    stat = file.stat()
    identity = {"path": str(file.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                "ctime_ns": stat.st_ctime_ns}
    record = models / ".gguf-digests" / f"{file.name}-{hashlib.sha1(identity['path'].encode()).hexdigest()[:12]}.json"
    try:
        remembered = json.loads(record.read_text())
        if isinstance(remembered, dict) and {k: remembered.get(k) for k in identity} == identity:
            return str(remembered["sha256"])
    except Exception:  # none yet, or damaged whatever json raised (RecursionError too): hashed again below
        pass
    digest = manifest.file_digest(file)  # looked up when called: tests count the files hashed
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(record, lambda partial: partial.write_text(json.dumps({**identity, "sha256": digest})))
    except (OSError, SpecbenchError):
        pass  # a cache that refuses the write (read-only, full) only means hashing again next time
    return digest


def converted_copy_problem(converted: Path) -> str | None:
    """None when the converted copy at ``converted`` is whole: every file its CHECKSUM_FILE lists is there, of its
    size, and (when its modification time changed) of its SHA-256 (``storage.manifest.verify_files``, as for databases).
    "missing" when there is no copy, else what is wrong with it."""
    checksum_file = converted / CHECKSUM_FILE
    if not converted.is_dir():
        return "missing"
    if not checksum_file.is_file():
        return f"no {CHECKSUM_FILE}: an older or unfinished conversion"
    try:
        manifest = json.loads(checksum_file.read_text())
    except Exception:  # unreadable, not UTF-8, not JSON, too deeply nested: damaged (the copy is made again)
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        return f"{CHECKSUM_FILE} is damaged"
    return verify_files(converted, manifest)



class GgufConversion(Artefact):
    """The converted copy of the GGUF ``file`` for the model ``name`` at ``dtype``, under ``models`` (the cache's
    models folder), converted again, with a warning, when the cached copy is damaged."""

    def __init__(self, file: Path, models: Path, name: str, torch_dtype):
        import transformers

        self.file, self.name, self.torch_dtype = file, name, torch_dtype
        key = hashlib.sha1(f"{file.name}:{gguf_digest(file, models)}:{transformers.__version__}".encode()
                           ).hexdigest()[:12]
        self.directory = models / f"{name}-{str(torch_dtype).removeprefix('torch.')}-{key}"
        self.command = f"python -m specbench.prepare --model {name}"

    @property
    def what(self) -> str:
        return f"a {str(self.torch_dtype).removeprefix('torch.')} checkpoint converted from {self.file.name}"

    @property
    def label(self) -> str:
        return f"converted copy of {self.file.name}"

    def estimate(self) -> tuple[float | None, str]:
        size = self.file.stat().st_size
        return (size * SECONDS_PER_GGUF_BYTE,
                f"{size / 1e6:.0f} MB of GGUF at {1e-6 / SECONDS_PER_GGUF_BYTE:.1f} MB/s, measured on SmolLM2-135M")

    def rebuild_command(self) -> str:
        return self.command

    def check(self) -> None:
        require_writable(self.directory, CACHE_HINT)  # a cache it cannot be written to is one line, not a notice

    def build(self) -> None:
        self.check()
        self.announce()
        convert_gguf(self.file, self.directory, self.torch_dtype)

    def load(self) -> Path:
        problem = converted_copy_problem(self.directory)
        if problem is not None:
            raise SpecbenchError(f"{self.directory}: the converted copy of {self.file.name} is {problem}")
        return self.directory

    def get(self) -> Path:
        """The converted copy's directory, converted first when it is missing or damaged. Without a build lock, as
        a conversion always was: the copy is published whole, so a second converter only repeats the work."""
        problem = converted_copy_problem(self.directory)
        if problem is not None:
            if problem != "missing":
                log.warning("the converted copy of %s in %s is damaged (%s); converting it again", self.file.name,
                            self.directory, problem)
            self.build()
        return self.directory

