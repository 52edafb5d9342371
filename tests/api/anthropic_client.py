"""The official Anthropic Python client against a running Perch server, unchanged.

Usage: anthropic_client.py BASE_URL MODEL API_KEY   (BASE_URL like http://127.0.0.1:7342)
MODEL is the installed instruct model; requests name a Claude model, which Perch's default
alias maps onto it. Prints one JSON line of what it checked; exits non-zero on the first
failure.
"""

import json
import sys

import anthropic

base_url, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)
CLAUDE = "claude-sonnet-4-5-20250929"
# This SDK no longer has sampling parameters (Anthropic's newer models take none); the API
# still accepts `temperature`, which older clients send, so it goes in the body as is.
GREEDY = {"extra_body": {"temperature": 0}}
checked = []


def check(name, cond, detail=""):
    if not cond:
        raise SystemExit(f"FAILED {name}: {detail}")
    checked.append(name)


def text(m):
    return "".join(b.text for b in m.content if b.type == "text")


# Plain, with a system prompt; the Claude name is answered by the installed model.
ask = [{"role": "user", "content": "What is 12 + 30? Answer with the number only."}]
m = client.messages.create(model=CLAUDE, max_tokens=20, **GREEDY, system="You are a calculator.", messages=ask)
check("message", m.type == "message" and m.role == "assistant" and "42" in text(m), m)
check("message.model", m.model == model, m.model)
check("message.stop_reason", m.stop_reason == "end_turn", m.stop_reason)
check("message.usage", m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10 and m.usage.output_tokens > 0, m.usage)

# Streamed: the same greedy answer, and the SDK assembles the same final message.
with client.messages.stream(model=CLAUDE, max_tokens=20, **GREEDY, system="You are a calculator.", messages=ask) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("stream", streamed == text(m), (streamed, text(m)))
check("stream.final", text(final) == streamed and final.stop_reason == "end_turn" and final.usage.output_tokens == m.usage.output_tokens, final)

# Counting tokens matches what the message's prompt cost.
n = client.messages.count_tokens(model=CLAUDE, system="You are a calculator.", messages=ask).input_tokens
check("count_tokens", n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (n, m.usage))

# max_tokens and stop sequences.
m2 = client.messages.create(model=CLAUDE, max_tokens=3, **GREEDY, messages=[{"role": "user", "content": "Write a long poem about the sea."}])
check("max_tokens", m2.stop_reason == "max_tokens" and m2.usage.output_tokens == 3, m2)
long = client.messages.create(model=CLAUDE, max_tokens=30, **GREEDY, messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}])
check("count", "5" in text(long), text(long))
m3 = client.messages.create(model=CLAUDE, max_tokens=30, **GREEDY, stop_sequences=["5"], messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}])
check("stop_sequence", m3.stop_reason == "stop_sequence" and m3.stop_sequence == "5" and "5" not in text(m3) and text(long).startswith(text(m3)), m3)

# A tool loop: the model asks for the weather, gets it, and answers with it.
tools = [
    {"name": "get_weather", "description": "Get the current weather in a city",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}}, "required": ["city"]}},
    {"name": "get_time", "description": "Get the current local time in a city",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
]
q = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
t = client.messages.create(model=CLAUDE, max_tokens=80, **GREEDY, tools=tools, messages=q)
uses = [b for b in t.content if b.type == "tool_use"]
check("tool_use", t.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", t)
check("tool_use.input", "Paris" in uses[0].input.get("city", ""), uses[0].input)
check("tool_use.no_markup", "<tool_call>" not in text(t), text(t))
follow = q + [
    {"role": "assistant", "content": t.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 18 degrees Celsius"}]},
]
# The result reaches the prompt (the call and its result are rendered by the chat template).
# What the model makes of it is its own affair: this 0.5B model repeats the call instead of
# answering, and llama.cpp does the same on the same prompt.
a = client.messages.create(model=CLAUDE, max_tokens=30, **GREEDY, tools=tools, messages=follow)
grew = (a.usage.input_tokens + a.usage.cache_read_input_tokens) - (t.usage.input_tokens + t.usage.cache_read_input_tokens)
check("tool_result", a.type == "message" and grew > 20 and a.stop_reason in ("end_turn", "max_tokens", "tool_use"), (grew, a))
check("tool_result.cached", a.usage.cache_read_input_tokens > 0, a.usage)
n = client.messages.count_tokens(model=CLAUDE, tools=tools, messages=follow).input_tokens
check("tool_result.count_tokens", n == a.usage.input_tokens + a.usage.cache_read_input_tokens, (n, a.usage))

# The same call streamed: the SDK builds the tool_use block from input_json deltas.
with client.messages.stream(model=CLAUDE, max_tokens=80, **GREEDY, tools=tools, messages=q) as s:
    kinds = [e.type for e in s]
    ts = s.get_final_message()
suses = [b for b in ts.content if b.type == "tool_use"]
check("stream.tool_use", ts.stop_reason == "tool_use" and [(b.name, b.input) for b in suses] == [(b.name, b.input) for b in uses], ts)
check("stream.events", kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_start" in kinds, kinds)

# tool_choice: a named tool is called; `any` calls one; `none` answers in text.
f = client.messages.create(model=CLAUDE, max_tokens=80, **GREEDY, tools=tools, tool_choice={"type": "tool", "name": "get_time"}, messages=q)
check("tool_choice.tool", [b.name for b in f.content if b.type == "tool_use"] == ["get_time"], f)
hello = [{"role": "user", "content": "Say hello."}]
r = client.messages.create(model=CLAUDE, max_tokens=80, **GREEDY, tools=tools, tool_choice={"type": "any"}, messages=hello)
check("tool_choice.any", any(b.type == "tool_use" for b in r.content) and r.stop_reason == "tool_use", r)
r = client.messages.create(model=CLAUDE, max_tokens=30, **GREEDY, tools=tools, tool_choice={"type": "none"}, messages=q)
check("tool_choice.none", not any(b.type == "tool_use" for b in r.content) and text(r), r)

# Structured output: the answer is JSON valid against the schema.
schema = {"type": "object", "properties": {"city": {"type": "string"}, "population_millions": {"type": "number"}},
          "required": ["city", "population_millions"], "additionalProperties": False}
r = client.messages.create(model=CLAUDE, max_tokens=60, **GREEDY, output_config={"format": {"type": "json_schema", "schema": schema}},
                           messages=[{"role": "user", "content": "Give the largest city of Japan and its population."}])
obj = json.loads(text(r))
check("output_config.format", set(obj) == {"city", "population_millions"} and isinstance(obj["population_millions"], (int, float)), obj)

# Errors, as the SDK's own exception types.
try:
    client.messages.create(model="llama-9000", max_tokens=5, messages=hello)
    check("error.not_found", False, "accepted an unknown model")
except anthropic.NotFoundError as e:
    check("error.not_found", e.body["error"]["type"] == "not_found_error", e.body)
try:
    client.messages.create(model=CLAUDE, max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    check("error.image", False, "accepted an image")
except anthropic.BadRequestError as e:
    check("error.image", "images" in e.message, e.message)
try:
    client.messages.create(model=CLAUDE, max_tokens=5, messages=hello, extra_body={"temperature": 1.5})
    check("error.temperature", False, "accepted temperature 1.5")
except anthropic.BadRequestError as e:
    check("error.temperature", "temperature" in e.message, e.message)
try:
    anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(model=CLAUDE, max_tokens=5, messages=hello)
    check("error.key", False, "accepted a wrong key")
except anthropic.AuthenticationError as e:
    check("error.key", e.status_code == 401, e)

print(json.dumps({"checked": checked}))
