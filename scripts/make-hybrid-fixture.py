#!/usr/bin/env python3
"""Build Perch's Qwen3.5-style hybrid fixture from mlx-lm's own model class, with goldens.

A 4-layer, hidden-64 `qwen3_5` model (gated DeltaNet linear attention in layers 0 and 2,
gated full attention with partial rotary in layers 1 and 3, dense SwiGLU MLPs) with seeded
random weights, saved in mlx-lm's layout (`language_model.model.*`, conv1d [C, K, 1]), and
the GPT-2-cut tokenizer of the other fixtures (copied from tests/fixtures/qwen3).

Goldens from mlx-lm 0.32.2 on the CPU (its gated delta recurrence in MLX operations): the
prompt's logits in one pass; the logits of the prompt's tail after its head went through
the cache (`split_logits`, a prefill from a cached state); 32 greedy tokens from
`generate_step` (a prefill, then decode steps through the recurrent state).

Usage: make-hybrid-fixture.py OUT_DIR          (run with .deps/venv/bin/python)
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
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


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(CONFIG))
    weights = random_parameters(model, seed=3500)
    model.update(tree_unflatten(list(weights.items())))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FROM / name, out / name)

    # The goldens come from the directory as mlx-lm loads it, not from the object above.
    model, _ = load_model(out)
    prompt_ids = json.loads((TOKENIZER_FROM / "golden.json").read_text())["prompt_ids"]
    prompt = mx.array([prompt_ids])
    logits = model(prompt)[0]
    cache = model.make_cache()
    model(prompt[:, :SPLIT], cache=cache)
    split_logits = model(prompt[:, SPLIT:], cache=cache)[0]
    tokens = [
        int(t)
        for t, _ in generate_step(mx.array(prompt_ids), model, max_tokens=GREEDY_STEPS,
                                  sampler=lambda x: mx.argmax(x, axis=-1))
    ]
    mx.save_safetensors(str(out / "golden.safetensors"),
                        {"logits": logits, "split_logits": split_logits})
    (out / "golden.json").write_text(json.dumps(
        {"source": "mlx-lm", "prompt_ids": prompt_ids, "split": SPLIT, "greedy_tokens": tokens},
        indent=1) + "\n")
    print(f"{out}: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
