"""A tiny random-weight Qwen2 model and byte-level BPE tokenizer, built locally (no download).

The model is what the live tests and the shipped CPU profile run on: Qwen2 architecture, hidden
128, 2 layers, 4 query heads, 2 KV heads (head_dim 32), bf16, ``max_position_embeddings`` 32768,
so a KV token costs 2 x 2 x 2 x 32 x 2 = 512 bytes. Weights are drawn with a fixed torch seed and
the tokenizer is trained on text generated from a fixed numpy seed, so two builds of the same
spec are equal. A directory is reused when its ``kvroute-tiny.json`` marker matches the spec.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

#: Served model name the tests and the shipped profile use.
TINY_MODEL_NAME = "tiny-qwen2"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MARKER = "kvroute-tiny.json"


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Shapes of the tiny model and its tokenizer.

    Attributes:
        vocab_size: BPE vocabulary incl. the 3 special tokens (the model's ``vocab_size``).
        hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads: Qwen2 shapes.
        max_position_embeddings: longest sequence, tokens (vLLM's default ``max_model_len``).
        seed: seeds the weights (torch) and the tokenizer's training text (numpy).
    """

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 32768
    seed: int = 0


def default_tiny_dir() -> Path:
    """Where the tiny model is cached: ``$KVROUTE_CACHE`` or ``~/.cache/kvroute``, + ``tiny-qwen2``."""
    root = os.environ.get("KVROUTE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kvroute")
    return Path(root) / TINY_MODEL_NAME


def _training_text(seed: int, num_lines: int = 4000) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=int(rng.integers(2, 9)))) for _ in range(3000)]
    lines = []
    for _ in range(num_lines):
        n = int(rng.integers(5, 20))
        idx = rng.zipf(1.3, size=n) % len(words)
        lines.append(" ".join(words[i] for i in idx) + rng.choice([".", "?", "!", ","]))
    return lines


def tiny_model_built(out_dir: str | Path | None = None, spec: TinySpec = TinySpec()) -> bool:
    """Whether ``out_dir`` (default :func:`default_tiny_dir`) already holds the tiny model built
    with ``spec``, so that :func:`build_tiny_model` returns it without building."""
    marker = (Path(out_dir) if out_dir is not None else default_tiny_dir()) / _MARKER
    try:
        return marker.is_file() and json.loads(marker.read_text()) == asdict(spec)
    except (OSError, json.JSONDecodeError):
        return False


TORCH_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""Packages vLLM's CPU wheel brings along that the tiny model does not use; builds of them that
do not match the installed torch break transformers' model imports."""


def torch_extras_hint() -> str:
    """``"; ..."``: the command that uninstalls the :data:`TORCH_EXTRAS` installed here, with why
    (docs/guide/calibrate-on-cpu.md), or ``""`` when none is."""
    import importlib.util

    found = [name for name in TORCH_EXTRAS if importlib.util.find_spec(name) is not None]
    if not found:
        return ""
    return (f"; {', '.join(found)} {'is' if len(found) == 1 else 'are'} installed, and vLLM's CPU wheel brings "
            "builds of them that break transformers' model imports: python -m pip uninstall -y "
            f"{' '.join(found)} (docs/guide/calibrate-on-cpu.md)")


def build_tiny_model(out_dir: str | Path | None = None, spec: TinySpec = TinySpec()) -> Path:
    """Build (or reuse) the tiny Qwen2 model and tokenizer in ``out_dir``.

    Args:
        out_dir: target directory; default :func:`default_tiny_dir`.
        spec: shapes and seed.

    Returns:
        The directory, loadable by ``transformers`` and by vLLM (``--model DIR``).

    Raises:
        ImportError: when torch, transformers or tokenizers are missing (the ``live`` extra), or
            do not import; with torchvision, torchaudio or torchcodec installed the message says
            to uninstall them (vLLM's CPU wheel brings builds of them that break transformers'
            Qwen2 import, ``ModuleNotFoundError: Could not import module 'Qwen2ForCausalLM'``).
    """
    out = Path(out_dir) if out_dir is not None else default_tiny_dir()
    marker = out / _MARKER
    want = asdict(spec)
    if tiny_model_built(out, spec):
        return out
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic BPE training
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    except ImportError as exc:
        raise ImportError(f"{exc}{torch_extras_hint()}") from exc

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(spec.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    vocab = tok.get_vocab_size()
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    marker.write_text(json.dumps(want))
    return out


def token_id_range(model_dir: str | Path) -> tuple[int, int]:
    """``[lo, hi)`` of ordinary (non-special) token ids of a tokenizer directory.

    Reads ``tokenizer.json`` when present (no ``transformers`` import); otherwise the model's
    ``config.json`` ``vocab_size`` with a margin of 300 ids at the top for special tokens.
    """
    d = Path(model_dir)
    tj = d / "tokenizer.json"
    if tj.is_file():
        doc = json.loads(tj.read_text())
        vocab = doc.get("model", {}).get("vocab", {})
        special = {t["id"] for t in doc.get("added_tokens", [])}
        ids = sorted(set(vocab.values()) - special)
        # ids are contiguous after the specials in a trained BPE
        return ids[0], ids[-1] + 1
    cfg = json.loads((d / "config.json").read_text())
    return 0, int(cfg["vocab_size"]) - 300


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else None))
