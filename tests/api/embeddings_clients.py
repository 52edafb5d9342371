"""The official openai and ollama Python clients, unchanged, embedding through Perch:
usage: embeddings_clients.py BASE_URL MODEL GOLDEN_JSON. Vectors are checked against
sentence-transformers' (the goldens), base64 against floats, and refusals by their field."""
import json
import sys

import ollama
import openai

base, model, golden_file = sys.argv[1], sys.argv[2], sys.argv[3]
golden = json.load(open(golden_file, encoding="utf-8"))


def cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / (na * nb)


short = [s for s, ids in zip(golden["corpus"], golden["corpus_ids"]) if len(ids) < 256]
want = [v for v, ids in zip(golden["corpus_vectors"], golden["corpus_ids"]) if len(ids) < 256]

oa = openai.OpenAI(base_url=base + "/v1", api_key="unused")
r = oa.embeddings.create(model=model, input=short)
assert [d.index for d in r.data] == list(range(len(short))), r
for s, d, w in zip(short, r.data, want):
    assert cos(d.embedding, w) >= 0.9999, (s, cos(d.embedding, w))
assert r.usage.prompt_tokens == sum(len(i) for i in golden["corpus_ids"] if len(i) < 256), r.usage
# The client asks for base64 unless told otherwise and decodes it itself; floats asked for
# explicitly are the same numbers.
# (The same input alone both times: inside a batch of other widths it rounds differently.)
b64 = oa.embeddings.create(model=model, input="hello world")
floats = oa.embeddings.create(model=model, input="hello world", encoding_format="float")
assert floats.data[0].embedding == b64.data[0].embedding, "base64 and float differ"
try:
    oa.embeddings.create(model=model, input="x", dimensions=100)
    raise SystemExit("dimensions 100 was not refused")
except openai.BadRequestError as e:
    assert e.body["param"] == "dimensions", e.body

ol = ollama.Client(host=base)
e = ol.embed(model=model, input=golden["corpus"])
assert len(e.embeddings) == len(golden["corpus"])
for s, v, w in zip(golden["corpus"], e.embeddings, golden["corpus_vectors"]):
    assert cos(v, w) >= 0.9999, (s[:40], cos(v, w))
assert e.prompt_eval_count == sum(len(i) for i in golden["corpus_ids"]), e.prompt_eval_count
legacy = ol.embeddings(model=model, prompt="hello world")
assert cos(legacy.embedding, golden["corpus_vectors"][0]) >= 0.9999
try:
    ol.embed(model=model, input=golden["corpus"][-1], truncate=False)
    raise SystemExit("an input over the length was not refused with truncate false")
except ollama.ResponseError as err:
    assert err.status_code == 400 and "input" in err.error, err
print("openai and ollama clients: ok")
