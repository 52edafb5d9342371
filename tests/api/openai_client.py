"""The official OpenAI Python client against a running Perch server, unchanged.

Usage: openai_client.py BASE_URL MODEL   (BASE_URL like http://127.0.0.1:7342/v1)
Prints one JSON line of what it checked; exits non-zero on the first failure.
"""

import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=60)
checked = []


def check(name, cond, detail=""):
    if not cond:
        raise SystemExit(f"FAILED {name}: {detail}")
    checked.append(name)


models = [m.id for m in client.models.list().data]
check("models.list", model in models, models)
check("models.retrieve", client.models.retrieve(model).id == model)

msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a bird."}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0)
c = r.choices[0]
check("chat", isinstance(c.message.content, str) and c.message.role == "assistant", r)
check("chat.usage", r.usage.completion_tokens == 10 and r.usage.total_tokens == r.usage.prompt_tokens + 10, r.usage)
check("chat.max_tokens", c.finish_reason == "length", c.finish_reason)
greedy = c.message.content

chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check("chat.stream", text == greedy, (text, greedy))
check("chat.stream.role", chunks[0].choices[0].delta.role == "assistant")
finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
check("chat.stream.finish", finish == ["length"], finish)
check("chat.stream.usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10, chunks[-1])

# A stop string taken from the greedy output ends the text right before it.
longer = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0).choices[0].message.content
stop = longer[len(longer) // 2:len(longer) // 2 + 3]
if stop:
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0, stop=[stop])
    out = r.choices[0].message.content
    check("chat.stop", r.choices[0].finish_reason == "stop" and stop not in out and longer.startswith(out), (stop, out))

a = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=1.2, seed=42).choices[0].message.content
b = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=1.2, seed=42).choices[0].message.content
check("chat.seed", a == b, (a, b))

r = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
lp = r.choices[0].logprobs.content
check("chat.logprobs", len(lp) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lp), lp)

r = client.chat.completions.create(model=model, messages=msgs, max_tokens=80, temperature=0, response_format={"type": "json_object"})
out = r.choices[0].message.content
if r.choices[0].finish_reason == "stop":
    check("chat.json_mode", isinstance(json.loads(out), dict), out)
else:
    check("chat.json_mode", out.strip().startswith("{"), out)

r = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=8, temperature=0)
check("completions", isinstance(r.choices[0].text, str) and r.usage.completion_tokens == 8, r)
streamed = "".join(ch.choices[0].text for ch in client.completions.create(model=model, prompt="The quick brown fox", max_tokens=8, temperature=0, stream=True) if ch.choices)
check("completions.stream", streamed == r.choices[0].text, (streamed, r.choices[0].text))
r = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=2, temperature=0, logprobs=2)
check("completions.logprobs", len(r.choices[0].logprobs.token_logprobs) == 2, r.choices[0].logprobs)

for name, kwargs, error in [
    ("error.temperature", dict(temperature=-1), openai.BadRequestError),
    ("error.n", dict(n=2), openai.BadRequestError),
    ("error.model", dict(model="no-such-model"), openai.NotFoundError),
]:
    try:
        client.chat.completions.create(**{"model": model, "messages": msgs, "max_tokens": 2, **kwargs})
        check(name, False, "no error")
    except error as e:
        check(name, isinstance(e.body, dict) and "message" in e.body, e.body)

print(json.dumps({"checked": checked}))
