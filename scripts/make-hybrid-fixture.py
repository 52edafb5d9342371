#!/usr/bin/env python3
"""Build Perch's Qwen3.5-style hybrid fixture from mlx-lm's own model class, with goldens.

A 4-layer, hidden-64 `qwen3_5` model (gated DeltaNet linear attention in layers 0 and 2,
gated full attention with partial rotary in layers 1 and 3, dense SwiGLU MLPs) with seeded
random weights, saved in mlx-lm's layout (`language_model.model.*`, conv1d [C, K, 1]), and
the GPT-2-cut tokenizer of the other fixtures (copied from tests/fixtures/qwen3).

It also carries a native MTP head (`mtp.fc`, `mtp.pre_fc_norm_embedding`,
`mtp.pre_fc_norm_hidden`, `mtp.layers.0.*` a gated full-attention block, `mtp.norm`), random
too. mlx-lm drops `mtp.*` at load, so the head's golden (`mtp_logits`: the logits for token
t+2 from every (hidden state at t, token t+1) pair of the prompt) comes from a reference
written here from the published description: norm the next token's embedding and the main
model's final hidden state, concatenate [embedding, hidden], project with `fc`, run the
block (mlx-lm's own `DecoderLayer`, causal), norm, and apply the main model's head.

Goldens from mlx-lm 0.32.2 on the CPU (its gated delta recurrence in MLX operations): the
prompt's logits in one pass; the logits of the prompt's tail after its head went through
the cache (`split_logits`, a prefill from a cached state); 32 greedy tokens from
`generate_step` (a prefill, then decode steps through the recurrent state).

Also `qwen3_5-4bit` and `qwen3_5-8bit`: the same weights MLX-quantized (groups of 32 and
64), without the MTP head, goldens from mlx-lm on each directory.

Usage: make-hybrid-fixture.py FIXTURES_DIR     (run with .deps/venv/bin/python)
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.models import qwen3_5
from mlx_lm.utils import load_model

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = ROOT / "tests/fixtures/qwen3"
GREEDY_STEPS = 32
SPLIT = 11  # prompt tokens prefilled before the tail whose logits `split_logits` holds

CONFIG = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "rope_parameters": {"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "bos_token_id": 4095,
    "eos_token_id": 4095,
    "torch_dtype": "float32",
}


def random_parameters(model, seed: int) -> dict:
    """Every parameter of `model`, drawn so activations stay O(1) and greedy steps are far
    from ties: matrices N(0, 1/fan_in), norms 1 + N(0, 0.1), the decay's A in (1, 16)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in tree_flatten(model.parameters()):
        shape = p.shape
        if name.endswith("A_log"):
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            a = rng.normal(1.0, 0.1, shape)
        elif name.endswith("conv1d.weight"):
            a = rng.normal(0, 1.0 / np.sqrt(shape[1]), shape)
        elif len(shape) == 1:
            a = 1.0 + rng.normal(0, 0.1, shape)
        elif name.endswith("embed_tokens.weight"):
            a = rng.normal(0, 1.0, shape)
        else:
            a = rng.normal(0, 1.0 / np.sqrt(shape[-1]), shape)
            if name.endswith("lm_head.weight"):
                a = a * 4.0
        out[name] = mx.array(a.astype(np.float32))
    return out


def mtp_parameters(args, seed: int) -> dict:
    """The MTP head's weights: the block has the shape of a full-attention layer."""
    block = qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)
    assert not block.is_linear
    out = {f"mtp.layers.0.{k}": v for k, v in random_parameters(block, seed).items()}
    rng = np.random.default_rng(seed + 1)
    h = args.hidden_size
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = mx.array((1.0 + rng.normal(0, 0.1, (h,))).astype(np.float32))
    out["mtp.fc.weight"] = mx.array(rng.normal(0, 1.0 / np.sqrt(2 * h), (h, 2 * h)).astype(np.float32))
    return out


def mtp_reference(model, args, mtp: dict, prompt) -> mx.array:
    """The head's logits for tokens 2.. of `prompt` ([L - 1, vocab]), as described above."""
    text = model.language_model
    eps = args.rms_norm_eps
    hidden = text.model(prompt)[:, :-1]  # after the final norm
    emb = text.model.embed_tokens(prompt[:, 1:])
    e = mx.fast.rms_norm(emb, mtp["mtp.pre_fc_norm_embedding.weight"], eps)
    h = mx.fast.rms_norm(hidden, mtp["mtp.pre_fc_norm_hidden.weight"], eps)
    x = mx.concatenate([e, h], axis=-1) @ mtp["mtp.fc.weight"].T
    block = qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)
    prefix = "mtp.layers.0."
    block.update(tree_unflatten([(k[len(prefix):], v) for k, v in mtp.items() if k.startswith(prefix)]))
    x = block(x, mask="causal", cache=None)
    x = mx.fast.rms_norm(x, mtp["mtp.norm.weight"], eps)
    return text.lm_head(x)[0]


def build(out: Path, quant: dict | None) -> None:
    """One fixture directory with its goldens (computed in f32, as Perch computes on the
    CPU); `quant`: MLX affine quantization of every linear layer and the embeddings (that
    variant carries no MTP head)."""
    out.mkdir(parents=True, exist_ok=True)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(CONFIG))
    weights = random_parameters(model, seed=3500)
    model.update(tree_unflatten(list(weights.items())))
    args = qwen3_5.TextModelArgs.from_dict(CONFIG)
    config = dict(CONFIG)
    mtp = {}
    if quant:
        nn.quantize(model, group_size=quant["group_size"], bits=quant["bits"])
        weights = dict(tree_flatten(model.parameters()))
        config["quantization"] = dict(quant)
    else:
        mtp = mtp_parameters(args, seed=3600)
    mx.save_safetensors(str(out / "model.safetensors"), weights | mtp, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FROM / name, out / name)

    # The goldens come from the directory as mlx-lm loads it, not from the object above.
    model, _ = load_model(out)
    model.set_dtype(mx.float32)
    prompt_ids = json.loads((TOKENIZER_FROM / "golden.json").read_text())["prompt_ids"]
    prompt = mx.array([prompt_ids])
    goldens = {"logits": model(prompt)[0]}
    cache = model.make_cache()
    model(prompt[:, :SPLIT], cache=cache)
    goldens["split_logits"] = model(prompt[:, SPLIT:], cache=cache)[0]
    tokens = [
        int(t)
        for t, _ in generate_step(mx.array(prompt_ids), model, max_tokens=GREEDY_STEPS,
                                  sampler=lambda x: mx.argmax(x, axis=-1))
    ]
    if mtp:
        goldens["mtp_logits"] = mtp_reference(model, args, mtp, prompt)
    mx.save_safetensors(str(out / "golden.safetensors"), goldens)
    (out / "golden.json").write_text(json.dumps(
        {"source": "mlx-lm", "prompt_ids": prompt_ids, "split": SPLIT, "greedy_tokens": tokens},
        indent=1) + "\n")
    print(f"{out}: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.2f} MB")


def main() -> None:
    fixtures = Path(sys.argv[1])
    build(fixtures / "qwen3_5", None)
    build(fixtures / "qwen3_5-4bit", {"group_size": 32, "bits": 4})
    build(fixtures / "qwen3_5-8bit", {"group_size": 64, "bits": 8})


if __name__ == "__main__":
    main()
