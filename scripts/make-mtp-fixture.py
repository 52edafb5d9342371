#!/usr/bin/env python3
"""Train Perch's MTP fixture: a tiny Qwen 3 model with a Qwen3-Next-style MTP head.

The language is a Markov chain over 60 words: each word is followed by its favourite
successor with probability 0.85 and by one of three others otherwise. A 6-layer, hidden-64
Qwen 3 model learns it, and an MTP head (`mtp.fc`, `mtp.pre_fc_norm_embedding`,
`mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`, sharing the embeddings and the tied
head) learns the token after next from the main model's final hidden state and the next
token's embedding. Its greedy drafts agree with the main model often, so speculative decoding
has something to gain; its distributions are not one-hot, so sampling tests have something to
check. The vocabulary is 64 word-level tokens, small enough for a chi-square test.

Everything is seeded; the output is the same on every run on the same MLX version.
Goldens (`golden.json`, `golden.safetensors`) come from this script's own forward passes:
the main model's logits for the prompt, the MTP head's logits for every (hidden, next token)
pair in it, and 32 greedy tokens computed without a KV cache.

Usage: make-mtp-fixture.py OUT_DIR        (run with .deps/venv/bin/python)
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx_lm.models import qwen3

WORDS = 60
BOS, EOS, UNK, PAD = 60, 61, 62, 63
VOCAB = 64
SEQ = 64
BATCH = 32
STEPS = 700
GREEDY_STEPS = 32

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "vocab_size": VOCAB,
    "tie_word_embeddings": True,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "num_nextn_predict_layers": 1,
    "torch_dtype": "float32",
}


def word(i: int) -> str:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    return consonants[i % 14] + vowels[(i // 14) % 5] + consonants[(i * 7 + 3) % 14] + vowels[i % 5]


def chain(rng: np.random.Generator) -> np.ndarray:
    """Transition matrix [WORDS, WORDS]."""
    favourite = rng.permutation(WORDS)
    t = np.zeros((WORDS, WORDS))
    for i in range(WORDS):
        others = rng.choice([j for j in range(WORDS) if j != favourite[i]], size=3, replace=False)
        t[i, favourite[i]] = 0.85
        t[i, others] = 0.05
    return t


def sample_sequences(t: np.ndarray, rng: np.random.Generator, n: int, length: int) -> np.ndarray:
    out = np.zeros((n, length), dtype=np.int32)
    out[:, 0] = rng.integers(0, WORDS, size=n)
    cum = np.cumsum(t, axis=1)
    for p in range(1, length):
        u = rng.random(n)
        out[:, p] = np.minimum((cum[out[:, p - 1]] < u[:, None]).sum(axis=1), WORDS - 1)
    return out


class MtpHead(nn.Module):
    def __init__(self, args: qwen3.ModelArgs):
        super().__init__()
        h = args.hidden_size
        self.pre_fc_norm_embedding = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = [qwen3.TransformerBlock(args)]
        self.norm = nn.RMSNorm(h, eps=args.rms_norm_eps)

    def __call__(self, hidden, embeddings):
        x = mx.concatenate([self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1)
        x = self.fc(x)
        mask = "causal" if x.shape[1] > 1 else None
        x = self.layers[0](x, mask, None)
        return self.norm(x)


class WithMtp(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.main = qwen3.Model(args)
        self.mtp = MtpHead(args)

    def hidden(self, tokens):
        return self.main.model(tokens)  # after the final norm

    def head(self, h):
        return self.main.model.embed_tokens.as_linear(h)

    def mtp_hidden(self, hidden, next_tokens):
        return self.mtp(hidden, self.main.model.embed_tokens(next_tokens))


def loss_fn(model: WithMtp, x):
    h = model.hidden(x[:, :-1])
    main = nn.losses.cross_entropy(model.head(h), x[:, 1:]).mean()
    # MTP at p: (h_p, x[p+1]) -> x[p+2]. The main model is not trained through the MTP loss.
    m = model.mtp_hidden(mx.stop_gradient(h[:, :-1]), x[:, 1:-1])
    mtp = nn.losses.cross_entropy(model.head(m), x[:, 2:]).mean()
    return main + mtp, (main, mtp)


def tokenizer_files(d: Path) -> None:
    vocab = {word(i): i for i in range(WORDS)}
    specials = {"<s>": BOS, "</s>": EOS, "<unk>": UNK, "<pad>": PAD}
    vocab.update(specials)
    assert len(set(vocab)) == VOCAB
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for c, i in specials.items()
        ],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (d / "tokenizer.json").write_text(json.dumps(tok, indent=1) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 2048, "add_bos_token": False}, indent=1) + "\n")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(7)
    rng = np.random.default_rng(7)
    t = chain(rng)
    args = qwen3.ModelArgs.from_dict(CONFIG)
    model = WithMtp(args)
    opt = optim.AdamW(learning_rate=optim.cosine_decay(3e-3, STEPS, 3e-4), weight_decay=0.0)
    step = nn.value_and_grad(model, loss_fn)
    for i in range(STEPS):
        x = mx.array(sample_sequences(t, rng, BATCH, SEQ + 1))
        (loss, (main, mtp)), grads = step(model, x)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        if i % 100 == 0 or i == STEPS - 1:
            print(f"step {i:4d}  main loss {main.item():.3f}  mtp loss {mtp.item():.3f}", flush=True)
    # The chain's own entropy (the best a model can do): 0.85 / 3 x 0.05.
    print(f"entropy floor {-(0.85 * np.log(0.85) + 0.15 * np.log(0.05)):.3f}")

    weights = dict(nn.utils.tree_flatten(model.main.parameters()))
    weights.update({f"mtp.{k}": v for k, v in nn.utils.tree_flatten(model.mtp.parameters())})
    weights = {k: v.astype(mx.float32) for k, v in weights.items() if not k.startswith("lm_head")}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1, sort_keys=True) + "\n")
    tokenizer_files(out)

    prompt = [int(v) for v in sample_sequences(t, np.random.default_rng(99), 1, 24)[0]]
    h = model.hidden(mx.array([prompt]))
    logits = model.head(h)[0]
    mtp_logits = model.head(model.mtp_hidden(h[:, :-1], mx.array([prompt[1:]])))[0]
    tokens = list(prompt)
    for _ in range(GREEDY_STEPS):
        tokens.append(int(mx.argmax(model.head(model.hidden(mx.array([tokens])))[0, -1]).item()))
    greedy = tokens[len(prompt):]
    agree = np.mean([int(a == b) for a, b in zip(mx.argmax(mtp_logits, -1).tolist(), mx.argmax(logits, -1).tolist()[1:])])
    print(f"MTP argmax == main's next argmax on the prompt: {agree:.2f}")
    mx.save_safetensors(str(out / "golden.safetensors"), {"logits": logits, "mtp_logits": mtp_logits})
    (out / "golden.json").write_text(json.dumps({
        "source": "scripts/make-mtp-fixture.py", "prompt": " ".join(word(i) for i in prompt),
        "prompt_ids": prompt, "greedy_tokens": greedy}, indent=1) + "\n")
    print(f"{out}: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
