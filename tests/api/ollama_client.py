"""The official Ollama Python client against a running Perch server, unchanged.

Usage: ollama_client.py BASE_URL MODEL   (BASE_URL like http://127.0.0.1:7342)
Prints one JSON line of what it checked; exits non-zero on the first failure.
"""

import json
import sys

import ollama

base_url, model = sys.argv[1], sys.argv[2]
client = ollama.Client(host=base_url, timeout=300)
GREEDY = {"temperature": 0}
checked = []


def check(name, cond, detail=""):
    if not cond:
        raise SystemExit(f"FAILED {name}: {detail}")
    checked.append(name)


check("version", client._request_raw("GET", "/api/version").json()["version"])
names = [m.model for m in client.list().models]
check("list", f"{model}:latest" in names, names)
info = client.show(model)
check("show", "tools" in info.capabilities and info.modelinfo and info.template, info)

msgs = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 12 + 30? Answer with the number only."}]
r = client.chat(model=model, messages=msgs, options=GREEDY)
check("chat", r.done and r.message.role == "assistant" and "42" in r.message.content, r)
check("chat.timings", r.eval_count > 0 and r.prompt_eval_count > 0 and r.eval_duration > 0 and r.done_reason == "stop", r)
parts = list(client.chat(model=model, messages=msgs, options=GREEDY, stream=True))
check("chat.stream", "".join(p.message.content for p in parts) == r.message.content and parts[-1].done and not parts[0].done, parts[-1])

g = client.generate(model=f"{model}:latest", prompt="Count from 1 to 20, separated by commas.", options={**GREEDY, "num_predict": 5})
check("generate.num_predict", g.done_reason == "length" and g.eval_count == 5, g)
g2 = client.generate(model=model, prompt="Count from 1 to 20, separated by commas.", options={**GREEDY, "num_predict": 40, "stop": ["5"]})
check("generate.stop", "5" not in g2.response and g2.response.startswith(g.response.rstrip(",").split(",")[0]), g2.response)

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}}, "required": ["city"]}}}]
q = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
t = client.chat(model=model, messages=q, tools=tools, options=GREEDY)
calls = t.message.tool_calls or []
check("tools", len(calls) == 1 and calls[0].function.name == "get_weather" and "Paris" in calls[0].function.arguments.get("city", ""), t.message)
check("tools.no_markup", "<tool_call>" not in (t.message.content or ""), t.message.content)
ts = list(client.chat(model=model, messages=q, tools=tools, options=GREEDY, stream=True))
scalls = [c for p in ts for c in (p.message.tool_calls or [])]
check("tools.stream", [(c.function.name, dict(c.function.arguments)) for c in scalls] == [(c.function.name, dict(c.function.arguments)) for c in calls], ts)
follow = q + [t.message, {"role": "tool", "content": "Sunny, 18 degrees Celsius", "tool_name": "get_weather"}]
a = client.chat(model=model, messages=follow, tools=tools, options={**GREEDY, "num_predict": 30})
check("tools.result", a.done and a.prompt_eval_count is not None, a)

schema = {"type": "object", "properties": {"city": {"type": "string"}, "population_millions": {"type": "number"}},
          "required": ["city", "population_millions"], "additionalProperties": False}
s = client.chat(model=model, messages=[{"role": "user", "content": "Give the largest city of Japan and its population."}], format=schema, options={**GREEDY, "num_predict": 60})
obj = json.loads(s.message.content)
check("format.schema", set(obj) == {"city", "population_millions"}, obj)
j = client.generate(model=model, prompt="Describe a cat as a JSON object.", format="json", options={**GREEDY, "num_predict": 80})
check("format.json", isinstance(json.loads(j.response), dict), j.response)

try:
    client.chat(model="llama-9000", messages=q)
    check("error.not_found", False, "accepted an unknown model")
except ollama.ResponseError as e:
    check("error.not_found", e.status_code == 404 and "llama-9000" in e.error, e)
try:
    client.chat(model=model, messages=q, options={"mirostat": 2})
    check("error.option", False, "accepted mirostat")
except ollama.ResponseError as e:
    check("error.option", e.status_code == 400 and "mirostat" in e.error, e)

# keep_alive: 0 unloads the model; a load request loads it again.
check("ps.loaded", any(m.model == f"{model}:latest" for m in client.ps().models), client.ps())
u = client.generate(model=model, keep_alive=0)
check("unload", u.done and u.done_reason == "unload" and not client.ps().models, (u, client.ps()))
# The next answer loads it, and says how long that took apart from the prompt's reading.
hi = [{"role": "user", "content": "Say hi."}]
c1 = client.chat(model=model, messages=hi, options={"temperature": 0, "num_predict": 3})
c2 = client.chat(model=model, messages=hi, options={"temperature": 0, "num_predict": 3})
check("load_duration", c1.load_duration > 10_000_000 and c2.load_duration < c1.load_duration / 10
      and c1.total_duration >= c1.load_duration + c1.prompt_eval_duration, (c1, c2))
l = client.generate(model=model)
check("load", l.done_reason == "load" and any(m.model == f"{model}:latest" for m in client.ps().models), client.ps())

print(json.dumps({"checked": checked}))
