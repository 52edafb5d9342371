// The chat: one conversation's branch, sending, stopping, regenerating, editing and
// resending (the earlier answer kept as a branch to flip back to), copying, attachments,
// the context meter and each answer's figures.
import { $, el, explain, api, ApiError, prefs } from "./api.js";
import { renderInto, renderStreaming, copyText } from "./markdown.js";
import { streamChat } from "./stream.js";
import * as store from "./store.js";
import { add, branch, deepest, history, parsesAsObject, siblings } from "./tree.js";

let conv = null;
let inFlight = null; // AbortController of the streaming answer
let pending = []; // attachments for the next message: {name, text}
let models = []; // /v1/models entries (context_length, loaded)
let onChange = () => {}; // the sidebar's refresh
let opened = () => {}; // another chat is shown (the presets' chooser resets)
let shown = 0; // bumped whenever the user picks a chat: a slower load never replaces it

export const busy = () => inFlight !== null;
const byId = (id) => conv.messages.find((m) => m.id === id);
export const currentId = () => conv && conv.id;
export function onListChange(f) {
  onChange = f;
}
export function onOpen(f) {
  opened = f;
}

export function status(text) {
  $("#chat-notice").textContent = text;
}

async function persist() {
  try {
    await store.save(conv);
  } catch (e) {
    if (e instanceof ApiError && e.code === "conflict") {
      conv = await store.load(conv.id);
      render();
    }
    status(explain(e));
  }
  onChange();
}

export async function open(id) {
  if (busy()) return;
  const mine = ++shown;
  let loaded;
  try {
    loaded = await store.load(id);
  } catch (e) {
    status(explain(e));
    return;
  }
  if (mine !== shown) return;
  conv = loaded;
  status("");
  prefs.set("openChat", conv.id);
  opened();
  render();
  onChange();
}

// The chat this window showed last, after a reload (when it still exists).
export async function reopen() {
  const id = prefs.get("openChat", null);
  if (!id || busy() || (conv && conv.messages.length)) return;
  const mine = shown;
  try {
    const loaded = await store.load(id);
    if (mine !== shown || busy()) return;
    conv = loaded;
    render();
  } catch {
    prefs.set("openChat", null);
  }
}

export function newChat() {
  if (busy()) return;
  shown++;
  conv = store.blank($("#model").value);
  prefs.set("openChat", conv.id);
  opened();
  render();
  onChange();
  $("#prompt").focus();
}

// ---- Rendering --------------------------------------------------------------------------

function fillAnswer(div, m, streaming = false) {
  let details = div.querySelector("details.reasoning");
  if (m.reasoning && !details) {
    details = el("details", { class: "reasoning" }, el("summary"), el("div", { class: "reasoning-text" }));
    div.prepend(details);
  }
  if (details) {
    details.querySelector("summary").textContent = `Reasoning · ${m.reasoning.trim().split(/\s+/).length} words`;
    details.querySelector(".reasoning-text").textContent = m.reasoning;
  }
  let calls = div.querySelector(".tool-calls");
  if (m.tool_calls && m.tool_calls.length) {
    if (!calls) {
      calls = el("div", { class: "tool-calls" });
      div.querySelector(".body").before(calls);
    }
    calls.replaceChildren(
      ...m.tool_calls.map((c) => {
        let shown = c.arguments;
        try {
          shown = JSON.stringify(JSON.parse(c.arguments), null, 2);
        } catch {} // still streaming, or not JSON: as it came
        return el("div", { class: "tool-call" }, el("div", { class: "tool-name", text: `Called ${c.name}` }), el("pre", { text: shown }));
      }),
    );
  }
  (streaming ? renderStreaming : renderInto)(div.querySelector(".body"), m.content);
  // An answer with nothing to show (only whitespace or markup the template hides) says so.
  if (!streaming && !m.content.trim() && !m.reasoning && !(m.tool_calls && m.tool_calls.length) && m.stats && !m.stats.stopped) {
    div.querySelector(".body").replaceChildren(el("span", { class: "hint", text: "(the model's answer was empty)" }));
  }
}

// The call a tool message answers (on its parent, the assistant message that made it).
function toolCallOf(m) {
  const parent = conv.messages.find((x) => x.id === m.parent);
  return parent && (parent.tool_calls || []).find((c) => c.id === m.tool_call_id);
}

function statsText(s) {
  if (s.stopped) return "stopped";
  const parts = [`${s.completion_tokens ?? "?"} tokens`];
  if (s.tokens_per_s) parts.push(`${s.tokens_per_s.toFixed(1)} tok/s`);
  if (s.ttft_ms != null) parts.push(`first token ${(s.ttft_ms / 1000).toFixed(2)} s`);
  if (s.cached_tokens) parts.push(`${s.cached_tokens.toLocaleString("en-US")} prompt tokens reused`);
  return parts.join(" · ");
}

function branchSwitch(m) {
  const sibs = siblings(conv, m).filter((x) => x.role === m.role);
  if (sibs.length < 2) return null;
  const i = sibs.findIndex((x) => x.id === m.id);
  const go = (j) => () => {
    if (busy()) return;
    conv.current = deepest(conv, sibs[j]).id;
    render();
    persist();
  };
  return el(
    "span",
    { class: "branches", role: "group", "aria-label": "Versions" },
    el("button", { type: "button", class: "prev", text: "‹", "aria-label": "Previous version", disabled: i === 0, onclick: go(i - 1) }),
    el("span", { class: "which", text: `${i + 1}/${sibs.length}` }),
    el("button", { type: "button", class: "next", text: "›", "aria-label": "Next version", disabled: i === sibs.length - 1, onclick: go(i + 1) }),
  );
}

function messageEl(m) {
  const div = el("div", { class: `msg ${m.role}${m.error ? " error" : ""}`, "data-id": m.id });
  div.append(el("div", { class: "body" }));
  if (m.role === "assistant" && !m.error) fillAnswer(div, m);
  else if (m.role === "tool") {
    const call = toolCallOf(m);
    div.prepend(el("div", { class: "tool-name", text: `Result of ${call ? call.name : "a tool"}` }));
    div.querySelector(".body").append(el("pre", { text: m.error || m.content }));
  } else div.querySelector(".body").textContent = m.error || m.content;
  if (m.attachments && m.attachments.length) {
    div.append(el("div", { class: "attached" }, ...m.attachments.map((a) => el("span", { class: "chip", text: a.name, title: "Attached file" }))));
  }
  if (m.stats) div.append(el("div", { class: "stats", text: statsText(m.stats) }));
  const actions = el("div", { class: "actions" }, branchSwitch(m));
  actions.append(el("button", { type: "button", class: "copy", text: "Copy", "aria-label": "Copy this message", onclick: (ev) => copyText(m.content, ev.target) }));
  if (m.role === "user") actions.append(el("button", { type: "button", class: "edit", text: "Edit", onclick: () => startEdit(div, m) }));
  if (m.role === "assistant" && byId(m.parent)?.role === "user") actions.append(el("button", { type: "button", class: "regenerate", text: "Regenerate", onclick: () => regenerate(m) }));
  div.append(actions);
  return div;
}

export function render() {
  if (!conv) conv = store.blank($("#model").value);
  const box = $("#messages");
  box.replaceChildren(...branch(conv).map(messageEl));
  box.scrollTop = box.scrollHeight;
  $("#system").value = conv.settings.system || "";
  $("#temperature").value = conv.settings.temperature ?? 0.7;
  $("#top-p").value = conv.settings.top_p ?? "";
  $("#max-tokens").value = conv.settings.max_tokens ?? "";
  $("#tools").value = conv.settings.tools || "";
  if (conv.settings.model && [...$("#model").options].some((o) => o.value === conv.settings.model)) $("#model").value = conv.settings.model;
  meter();
}

// The context meter: how much of the model's context the branch's last answer used.
function meter() {
  const model = models.find((m) => m.id === $("#model").value);
  const last = branch(conv).filter((m) => m.stats && !m.stats.stopped).pop();
  const ctx = model && model.context_length;
  const used = last ? (last.stats.prompt_tokens || 0) + (last.stats.completion_tokens || 0) : 0;
  const out = $("#context-meter");
  out.textContent = `Context ${used.toLocaleString("en-US")}${ctx ? ` of ${ctx.toLocaleString("en-US")}` : ""} tokens` + (last && last.stats.cached_tokens ? ` · ${last.stats.cached_tokens.toLocaleString("en-US")} reused` : "");
  const bar = $("#context-bar");
  bar.max = ctx || 1;
  bar.value = Math.min(used, ctx || 1);
}

export async function loadModelChoices(defaultModel) {
  try {
    const list = await api("/v1/models");
    // The chat picker offers the models that chat; embedding models are listed elsewhere.
    models = list.data.filter((m) => m.kind !== "embedding");
    const sel = $("#model");
    const keep = sel.value;
    sel.replaceChildren(...models.map((m) => new Option(m.id + (m.loaded ? " (loaded)" : ""), m.id)));
    sel.value = (conv && conv.settings.model) || keep || defaultModel || (models[0] && models[0].id) || "";
    if (conv) meter();
  } catch {
    setTimeout(() => loadModelChoices(defaultModel), 1000);
  }
}

// ---- Editing ----------------------------------------------------------------------------

function startEdit(div, m) {
  if (busy()) return;
  const area = el("textarea", { class: "edit-text", rows: 3, "aria-label": "Edit your message" });
  area.value = m.content;
  const save = el("button", { type: "button", class: "resend", text: "Send" });
  const cancel = el("button", { type: "button", text: "Cancel", onclick: render });
  save.onclick = () => {
    const text = area.value.trim();
    if (!text) return;
    // A sibling of the edited message: the earlier question and its answers stay a branch.
    conv.current = m.parent ?? null;
    const edited = add(conv, { parent: m.parent ?? null, role: "user", content: text, attachments: m.attachments || [] });
    generate(edited.id);
  };
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      save.click();
    } else if (ev.key === "Escape") render();
  });
  div.replaceChildren(area, el("div", { class: "actions" }, save, cancel));
  area.focus();
}

function regenerate(m) {
  if (busy() || !m.parent) return;
  generate(m.parent);
}

// ---- Sending ----------------------------------------------------------------------------

export function send(text) {
  if (busy()) return;
  shown++;
  readOptions();
  if (!conv.messages.length) conv.title = text.slice(0, 60) || "Chat";
  const parent = conv.current ?? null;
  const q = add(conv, { parent, role: "user", content: text, attachments: pending });
  pending = [];
  showPending();
  prefs.set("openChat", conv.id);
  generate(q.id);
}

function readOptions() {
  const num = (v) => (v === "" ? null : Number(v));
  conv.settings.model = $("#model").value;
  conv.settings.system = $("#system").value;
  conv.settings.temperature = num($("#temperature").value);
  conv.settings.top_p = num($("#top-p").value);
  conv.settings.max_tokens = num($("#max-tokens").value);
  conv.settings.tools = $("#tools").value;
}

function setBusy(b) {
  $("#send").hidden = b;
  $("#stop").hidden = !b;
}

// Answer the message `parentId` (a question, or a tool's result): a new assistant message
// under it, streamed in; when it calls MCP tools, each call is asked for, run, and answered
// again, up to MAX_TOOL_ROUNDS times.
const MAX_TOOL_ROUNDS = 8;

async function generate(parentId, round = 0) {
  readOptions();
  const s = conv.settings;
  const messages = history(conv, parentId);
  let tools = null;
  if (s.tools) {
    try {
      const r = await api("/perch/mcp/tools");
      tools = r.tools;
      if (r.errors.length) status(r.errors.map((e) => e.message).join(" · "));
    } catch (e) {
      status(`MCP tools are unavailable: ${explain(e)}`);
    }
  }
  conv.current = parentId;
  const answer = add(conv, { parent: parentId, role: "assistant", content: "" });
  await persist();
  render();
  const div = $("#messages").lastElementChild;
  const body = div.querySelector(".body");
  const option = $("#model").selectedOptions[0];
  if (option && !option.textContent.endsWith("(loaded)")) {
    body.textContent = `Loading ${s.model}…`;
    body.classList.add("loading");
  }
  inFlight = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstAt = null; // the first token shown
  let chunkAt = null; // the first delta of any kind: the rate runs from here
  let usage = null;
  let stopped = false;
  let frame = 0;
  const request = { model: s.model, messages };
  if (s.temperature != null) request.temperature = s.temperature;
  if (s.top_p != null) request.top_p = s.top_p;
  if (s.max_tokens != null) request.max_tokens = s.max_tokens;
  if (tools && tools.length) {
    request.tools = tools.map((t) => ({ type: "function", function: { name: toolName(t), description: t.description, parameters: closed(t.input_schema) } }));
    // `required` forces the first answer after a question only; after a result, the model decides.
    request.tool_choice = s.tools === "required" && round === 0 ? "required" : "auto";
  }
  try {
    usage = await streamChat(request, {
      signal: inFlight.signal,
      onStart: ({ promptTokens }) => {
        // A long prompt takes a while before its first token: say what is happening.
        if (promptTokens >= 1000) {
          body.textContent = `Reading ${promptTokens.toLocaleString("en-US")} tokens…`;
          body.classList.add("loading");
        }
      },
      onDelta: (delta) => {
        if (chunkAt === null) chunkAt = performance.now();
        const calls = delta.tool_calls || [];
        if (!delta.content && !delta.reasoning_content && !calls.length) return;
        if (firstAt === null) {
          firstAt = performance.now();
          body.classList.remove("loading");
        }
        answer.content += delta.content || "";
        if (delta.reasoning_content) answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
        for (const c of calls) {
          answer.tool_calls = answer.tool_calls || [];
          const call = (answer.tool_calls[c.index] = answer.tool_calls[c.index] || { id: "", name: "", arguments: "" });
          if (c.id) call.id = c.id;
          if (c.function && c.function.name) call.name = c.function.name;
          if (c.function && c.function.arguments) call.arguments += c.function.arguments;
        }
        // One render per frame, however fast tokens come.
        if (!frame) {
          frame = requestAnimationFrame(() => {
            frame = 0;
            fillAnswer(div, answer, true);
            const box = $("#messages");
            box.scrollTop = box.scrollHeight;
          });
        }
      },
    });
  } catch (e) {
    if (e.name === "AbortError") stopped = true;
    else answer.error = explain(e);
  } finally {
    cancelAnimationFrame(frame);
    inFlight = null;
    setBusy(false);
  }
  if (!answer.error) {
    const secs = (performance.now() - (chunkAt ?? started)) / 1000;
    const tokens = usage ? usage.completion_tokens : null;
    answer.stats = {
      model: s.model,
      prompt_tokens: usage ? usage.prompt_tokens : null,
      cached_tokens: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens || 0 : null,
      completion_tokens: tokens,
      ttft_ms: firstAt !== null ? firstAt - started : null,
      tokens_per_s: tokens && secs > 0 ? tokens / secs : null,
      stopped,
    };
  }
  await persist();
  render();
  if (tools && !stopped && !answer.error && answer.tool_calls && answer.tool_calls.length) {
    if (round + 1 >= MAX_TOOL_ROUNDS) status(`Stopped after ${MAX_TOOL_ROUNDS} rounds of tool calls in a row.`);
    else await runTools(answer, tools, round);
  }
}

// A tool's parameters as offered: arguments the tool does not name are never useful, so an
// object schema that leaves `additionalProperties` open is closed (as OpenAI's strict mode
// does); constrained decoding then cannot invent keys.
function closed(schema) {
  const s = schema && typeof schema === "object" ? { ...schema } : { type: "object", properties: {} };
  if (s.type === "object" && s.additionalProperties === undefined) s.additionalProperties = false;
  return s;
}

// A tool's name as the model sees it: its server's name before it, so two servers' tools
// never clash.
const toolName = (t) => `${t.server}__${t.name}`.slice(0, 64);

async function runTools(answer, tools, round) {
  let last = answer.id;
  if (!answer.tool_calls.every((c) => parsesAsObject(c.arguments))) {
    // Nothing runs on arguments that were cut off; the user can raise the limit and retry.
    status("The answer was cut off inside a tool call (raise Max tokens and regenerate); the call was not run.");
    return;
  }
  for (const call of answer.tool_calls) {
    const tool = tools.find((t) => toolName(t) === call.name);
    const args = JSON.parse(call.arguments || "{}");
    let content;
    let error = null;
    if (!tool) error = `There is no tool ${call.name}.`;
    else {
      const choice = tool.always_allowed ? "once" : await ask(tool, args);
      if (choice === "deny") error = "The user denied this call.";
      else {
        if (choice === "always") {
          try {
            await api("/perch/mcp/allow", { method: "POST", body: { server: tool.server, tool: tool.name } });
            tool.always_allowed = true;
          } catch (e) {
            status(explain(e));
          }
        }
        try {
          const r = await api("/perch/mcp/call", { method: "POST", body: { server: tool.server, tool: tool.name, arguments: args } });
          content = r.text;
          if (r.is_error) error = r.text || "The tool failed.";
        } catch (e) {
          error = explain(e);
        }
      }
    }
    conv.current = last;
    // The model reads the error as the result, so it can say what went wrong.
    const m = add(conv, { parent: last, role: "tool", tool_call_id: call.id, content: error ?? content ?? "" });
    last = m.id;
  }
  await persist();
  render();
  return generate(last, round + 1);
}

// Ask the user before a tool runs: allow once, always allow this tool, or deny.
function ask(tool, args) {
  return new Promise((resolve) => {
    const done = (choice) => () => {
      box.remove();
      $("#stop").removeEventListener("click", deny);
      setBusy(false);
      resolve(choice);
    };
    const deny = done("deny");
    const box = el(
      "div",
      { class: "permission", role: "alertdialog", "aria-label": `Allow ${tool.name}?` },
      el("div", { class: "tool-name", text: `Allow ${tool.server} → ${tool.name}?` }),
      el("div", { class: "hint", text: tool.description || "" }),
      el("pre", { text: JSON.stringify(args, null, 2) }),
      el(
        "div",
        { class: "actions" },
        el("button", { type: "button", class: "allow-once", text: "Allow once", onclick: done("once") }),
        el("button", { type: "button", class: "allow-always", text: "Always allow this tool", onclick: done("always") }),
        el("button", { type: "button", class: "deny", text: "Deny", onclick: deny }),
      ),
    );
    $("#messages").append(box);
    box.querySelector(".allow-once").focus();
    $("#messages").scrollTop = $("#messages").scrollHeight;
    setBusy(true);
    $("#stop").addEventListener("click", deny);
  });
}

export function stop() {
  if (inFlight) inFlight.abort();
}

// ---- Attachments ------------------------------------------------------------------------

const MAX_ATTACHMENT = 512 * 1024;

export async function attach(files) {
  const refused = [];
  for (const f of files) {
    if (f.type.startsWith("image/")) {
      refused.push(`${f.name}: this model cannot see images; attach text files (code, notes, logs)`);
      continue;
    }
    if (f.size > MAX_ATTACHMENT) {
      refused.push(`${f.name}: ${Math.round(f.size / 1024)} KB is more than the ${MAX_ATTACHMENT / 1024} KB an attachment may have`);
      continue;
    }
    let text;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(await f.arrayBuffer());
    } catch {
      text = null;
    }
    if (text === null || text.includes("\0")) {
      refused.push(`${f.name}: not a text file`);
      continue;
    }
    pending.push({ name: f.name, text });
  }
  showPending();
  status(refused.join(" · "));
}

function showPending() {
  $("#attachments").replaceChildren(
    ...pending.map((a, i) =>
      el(
        "span",
        { class: "chip" },
        a.name,
        el("button", { type: "button", text: "×", "aria-label": `Remove ${a.name}`, onclick: () => (pending.splice(i, 1), showPending()) }),
      ),
    ),
  );
}

// ---- Per-chat options -------------------------------------------------------------------

// The chat's options as a preset keeps them.
export function currentSettings() {
  if (!conv) render();
  readOptions();
  return { ...conv.settings };
}

// Set the chat's options from a preset (its model too, when it names an installed one).
export function applySettings(s) {
  $("#system").value = s.system || "";
  $("#temperature").value = s.temperature ?? "";
  $("#top-p").value = s.top_p ?? "";
  $("#max-tokens").value = s.max_tokens ?? "";
  $("#tools").value = s.tools || "";
  if (s.model && [...$("#model").options].some((o) => o.value === s.model)) $("#model").value = s.model;
  if ((s.system || "") !== "") $("#system").closest("details").open = true;
  optionChanged();
}

export function optionChanged() {
  if (!conv) return;
  readOptions();
  meter();
  if (conv.messages.length) persist();
}
