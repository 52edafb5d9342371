#!/usr/bin/env python3
"""The oracle for Perch's encoder: sentence-transformers' vectors for a corpus and a small
retrieval set, written to tests/fixtures/embeddings/minilm-golden.json.

Run with a Python that has sentence-transformers (it needs torch, several gigabytes, so CI
does not install it; the committed goldens are what the tests compare against):
    python scripts/make-embedding-goldens.py "$(scripts/fetch-minilm)"
"""
import json
import sys

from sentence_transformers import SentenceTransformer

LONG = " ".join(
    f"Sentence {i} of a long document about caching, tokenizers and the quiet hum of a laptop fan."
    for i in range(40)
)  # about 700 tokens: truncated at the model's 256

CORPUS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, jalapeño: accents and diacritics déjà vu.",
    "日本語の文章をベクトルに変換します。",
    "机器学习模型在本地运行。",
    "Emoji too 🚀🔥👍🏽 and a family 👨‍👩‍👧",
    "",
    "   ",
    "def add(a, b):\n    return a + b  # a tiny function",
    LONG,
]

QUERIES = ["how do I bake bread", "fastest way to sort a list in Python", "symptoms of the flu"]
DOCS = [
    "Knead the dough, let it rise for an hour and bake it at 220 degrees.",
    "Python's built-in sorted() uses Timsort and runs in O(n log n).",
    "Fever, cough, sore throat and body aches are common signs of influenza.",
    "The stock market closed higher on Friday after a volatile week.",
    "A sourdough starter needs flour, water and patience.",
    "Use list.sort() to sort in place, or sorted() for a new list.",
]


def main():
    model = SentenceTransformer(sys.argv[1], device="cpu")
    tok = model.tokenizer
    enc = lambda xs: model.encode(xs, batch_size=32, convert_to_numpy=True).tolist()
    ids = [tok(s, truncation=True, max_length=model.max_seq_length)["input_ids"] for s in CORPUS]
    out = {
        "oracle": "sentence-transformers",
        "max_seq_length": model.max_seq_length,
        "corpus": CORPUS,
        "corpus_ids": ids,
        "corpus_vectors": enc(CORPUS),
        "queries": QUERIES,
        "docs": DOCS,
        "query_vectors": enc(QUERIES),
        "doc_vectors": enc(DOCS),
    }
    path = "tests/fixtures/embeddings/minilm-golden.json"
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False)
    print(f"wrote {path}: {len(CORPUS)} sentences, token counts {[len(i) for i in ids]}")


if __name__ == "__main__":
    main()
