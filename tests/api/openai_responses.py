"""The official OpenAI Python client's Responses API against a running Perch server, unchanged.

Usage: openai_responses.py BASE_URL MODEL   (BASE_URL like http://127.0.0.1:7342)
MODEL is the installed instruct model. Prints one JSON line of what it checked; exits
non-zero on the first failure.
"""

import json
import sys

import openai
from pydantic import BaseModel

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
checked = []


def check(name, cond, detail=""):
    if not cond:
        raise SystemExit(f"FAILED {name}: {detail}")
    checked.append(name)


# Plain: a string input with instructions.
r = client.responses.create(model=model, instructions="You are a calculator.", temperature=0,
                            input="What is 12 + 30? Answer with the number only.", max_output_tokens=20)
check("response", r.object == "response" and r.status == "completed" and "42" in r.output_text, r)
check("response.model", r.model == model, r.model)
check("response.usage", r.usage.input_tokens > 10 and 0 < r.usage.output_tokens <= 20
      and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage)
check("response.echo", r.instructions == "You are a calculator." and r.max_output_tokens == 20 and r.temperature == 0, r)

# Streamed: the same greedy answer, events in order, and the SDK's final response agrees.
with client.responses.stream(model=model, instructions="You are a calculator.", temperature=0,
                             input="What is 12 + 30? Answer with the number only.", max_output_tokens=20) as s:
    kinds, deltas = [], []
    for e in s:
        kinds.append(e.type)
        if e.type == "response.output_text.delta":
            deltas.append(e.delta)
    final = s.get_final_response()
check("stream", "".join(deltas) == r.output_text and final.output_text == r.output_text, (deltas, r.output_text))
check("stream.events", kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
      and "response.output_item.added" in kinds and "response.output_text.done" in kinds, kinds)

# Items as input, and a conversation carried on by previous_response_id.
first = client.responses.create(model=model, temperature=0, max_output_tokens=30, input=[
    {"role": "user", "content": [{"type": "input_text", "text": "My name is Ada. Say hi."}]}])
again = client.responses.create(model=model, temperature=0, max_output_tokens=30, previous_response_id=first.id,
                                input="What is my name? Answer with the name only.")
check("previous_response_id", "Ada" in again.output_text and again.previous_response_id == first.id, again.output_text)
check("previous_response_id.cached", again.usage.input_tokens_details.cached_tokens > 0, again.usage)
got = client.responses.retrieve(first.id)
check("retrieve", got.id == first.id and got.output_text == first.output_text, got)
unstored = client.responses.create(model=model, temperature=0, max_output_tokens=5, input="Hi", store=False)
try:
    client.responses.create(model=model, max_output_tokens=5, previous_response_id=unstored.id, input="Again")
    check("store.false", False, "a response sent with store: false was kept")
except openai.NotFoundError as e:
    check("store.false", e.body["param"] == "previous_response_id", e.body)

# max_output_tokens ends the answer as incomplete.
r2 = client.responses.create(model=model, temperature=0, max_output_tokens=3, input="Write a long poem about the sea.")
check("incomplete", r2.status == "incomplete" and r2.incomplete_details.reason == "max_output_tokens"
      and r2.usage.output_tokens == 3, r2)

# A tool loop: the call comes back as a function_call item; its output goes back as an item.
tools = [
    {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}}, "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "Get the current local time in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
]
q = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
t = client.responses.create(model=model, temperature=0, max_output_tokens=80, tools=tools, input=q)
calls = [o for o in t.output if o.type == "function_call"]
check("function_call", len(calls) == 1 and calls[0].name == "get_weather" and "Paris" in json.loads(calls[0].arguments)["city"], t.output)
check("function_call.no_markup", "<tool_call>" not in t.output_text, t.output_text)
follow = q + [calls[0].model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 18 degrees Celsius"}]
a = client.responses.create(model=model, temperature=0, max_output_tokens=30, tools=tools, input=follow)
check("function_call_output", a.status in ("completed", "incomplete") and a.usage.input_tokens > t.usage.input_tokens + 20, (a.usage, t.usage))
# The same through previous_response_id: only the output is sent.
b = client.responses.create(model=model, temperature=0, max_output_tokens=30, tools=tools, previous_response_id=t.id,
                            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 18 degrees Celsius"}])
check("function_call_output.previous", b.usage.input_tokens == a.usage.input_tokens, (b.usage, a.usage))

# Streamed call: arguments arrive as deltas and add up to the whole call.
with client.responses.stream(model=model, temperature=0, max_output_tokens=80, tools=tools, input=q) as s:
    args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
    ts = s.get_final_response()
scalls = [o for o in ts.output if o.type == "function_call"]
check("stream.function_call", [(c.name, json.loads(c.arguments)) for c in scalls] == [(c.name, json.loads(c.arguments)) for c in calls]
      and json.loads(args) == json.loads(calls[0].arguments), (args, ts.output))

# tool_choice: a named function is called; none answers in text.
f = client.responses.create(model=model, temperature=0, max_output_tokens=80, tools=tools,
                            tool_choice={"type": "function", "name": "get_time"}, input=q)
check("tool_choice.function", [o.name for o in f.output if o.type == "function_call"] == ["get_time"], f.output)
n = client.responses.create(model=model, temperature=0, max_output_tokens=30, tools=tools, tool_choice="none", input=q)
check("tool_choice.none", not any(o.type == "function_call" for o in n.output) and n.output_text, n.output)


# Structured output through the SDK's own parse helper (text.format json_schema, strict).
class City(BaseModel):
    city: str
    population_millions: float


p = client.responses.parse(model=model, temperature=0, max_output_tokens=60, text_format=City,
                           input="Give the largest city of Japan and its population.")
check("text.format", isinstance(p.output_parsed, City) and p.output_parsed.city, p.output_text)

# Errors as the SDK's exception types, naming the field.
try:
    client.responses.create(model=model, input="Hi", tools=[{"type": "web_search"}])
    check("error.tool_type", False, "accepted a hosted tool")
except openai.BadRequestError as e:
    check("error.tool_type", e.body["param"] == "tools[0].type", e.body)
try:
    client.responses.create(model=model, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}])
    check("error.image", False, "accepted an image")
except openai.BadRequestError as e:
    check("error.image", e.body["param"] == "input[0].content[0]", e.body)
try:
    client.responses.create(model=model, input="Hi", background=True)
    check("error.background", False, "accepted background")
except openai.BadRequestError as e:
    check("error.background", e.body["param"] == "background", e.body)
try:
    client.responses.create(model="llama-9000", input="Hi")
    check("error.model", False, "accepted an unknown model")
except openai.NotFoundError as e:
    check("error.model", e.body["code"] == "model_not_found", e.body)

# keep_alive 0 (Ollama's semantics, accepted on every protocol) unloads the model when done.
import time

def loaded():
    return [m for m in client.models.list().data if m.id == model][0].model_extra.get("loaded")

check("keep_alive.loaded", loaded() is True, client.models.list())
client.responses.create(model=model, input="Hi", max_output_tokens=2, extra_body={"keep_alive": 0})
deadline = time.time() + 10
while loaded() and time.time() < deadline:
    time.sleep(0.1)
check("keep_alive.unload", loaded() is False, client.models.list())

deleted = client.responses.delete(first.id)
try:
    client.responses.retrieve(first.id)
    check("delete", False, "still there")
except openai.NotFoundError:
    check("delete", True)

print(json.dumps({"checked": checked}))
