"""Tiny causal language models built offline (a local byte-level BPE and a small Qwen2), for tests and demos.

Nothing is downloaded: the tokenizer is trained on the given text in milliseconds and the weights are random
(seeded) until someone trains them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEFAULT_CORPUS = (
    "You are a helpful assistant. Use the tools memory, search and calculator. "
    "My flight was cancelled; find a new flight for tomorrow morning. The answer is 42. "
    "Think step by step, then call a tool or answer the user. 0123456789 + - * / = ( ) "
)


def build_tiny_model(
    path: str | Path,
    *,
    corpus: Iterable[str] = (DEFAULT_CORPUS,),
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
) -> Path:
    """Write a tokenizer (with a ChatML chat template) and a randomly initialised Qwen2 model to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(list(corpus) * 4, trainer=trainer)
    tokenizer: Any = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out
