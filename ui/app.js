// Perch's UI: chat, models and settings. It talks to the engine only over HTTP (/v1, /api),
// so the same page runs in the desktop app's window and in any browser.
"use strict";

const $ = (sel) => document.querySelector(sel);
const store = {
  get(key, fallback) {
    try {
      const v = localStorage.getItem(`perch.${key}`);
      return v === null ? fallback : JSON.parse(v);
    } catch {
      return fallback;
    }
  },
  set(key, value) {
    localStorage.setItem(`perch.${key}`, JSON.stringify(value));
  },
};

// ---- HTTP -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(message, status, code, param) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = store.get("apiKey", "");
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(resp) {
  let body = null;
  try {
    body = await resp.json();
  } catch {}
  const e = body && body.error ? body.error : {};
  if (resp.status === 401) {
    const key = prompt("This Perch needs its API key (Settings → API key):");
    if (key !== null) store.set("apiKey", key.trim());
  }
  return new ApiError(e.message || `HTTP ${resp.status}`, resp.status, e.code, e.param);
}

async function api(path, { method = "GET", body, signal } = {}) {
  let resp;
  try {
    resp = await fetch(path, {
      method,
      signal,
      headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError("Cannot reach the Perch engine. Is it running?", 0, "unreachable");
  }
  if (!resp.ok) throw await failure(resp);
  return resp.json();
}

function explain(e) {
  switch (e.code) {
    case "engine_restarting":
      return `The engine is not ready: ${e.message}`;
    case "context_length_exceeded":
      return `This conversation no longer fits the model's context. Start a new chat or shorten it. (${e.message})`;
    case "model_not_found":
      return `${e.message}. Pick an installed model.`;
    default:
      return e.message;
  }
}

// ---- Views ------------------------------------------------------------------------------

function showView() {
  const name = (location.hash || "#chat").slice(1);
  for (const v of ["chat", "models", "settings"]) {
    $(`#view-${v}`).hidden = v !== name;
    document.querySelector(`nav a[data-view=${v}]`).classList.toggle("active", v === name);
  }
  if (name === "models") loadModels();
  if (name === "settings") loadSettings();
}
window.addEventListener("hashchange", showView);

// ---- Status -----------------------------------------------------------------------------

let lastStatus = null;

async function pollStatus() {
  try {
    const s = await api("/perch/status");
    lastStatus = s;
    const pill = $("#status");
    pill.dataset.phase = s.phase;
    pill.textContent = s.loading ? `Loading ${s.loading}…` : s.phase === "running" ? `Running · ${s.model || "no model"}` : s.message;
    const banner = $("#banner");
    banner.hidden = !s.config_error;
    banner.textContent = s.config_error ? `Settings problem: ${s.config_error.message} — the engine keeps its last good settings.` : "";
    if (s.config_error && !$("#view-settings").hidden) $("#settings-error").textContent = s.config_error.message;
    // The engine moved to another port: follow it.
    if (s.url && !s.url.startsWith(location.origin) && location.protocol.startsWith("http") && location.hostname === "127.0.0.1") {
      location.href = s.url + "/" + location.hash;
    }
  } catch (e) {
    if (e.status === 404) {
      // `perch serve` without a settings file: the engine API only.
      try {
        const h = await api("/health");
        $("#status").dataset.phase = "running";
        $("#status").textContent = `Running · ${h.model ? h.model.id : "no model"}`;
      } catch (e2) {
        $("#status").textContent = explain(e2);
      }
    } else {
      $("#status").dataset.phase = "failed";
      $("#status").textContent = explain(e);
    }
  }
}

// ---- Chat -------------------------------------------------------------------------------

let conversations = store.get("conversations", []);
let current = store.get("current", null);
let inFlight = null; // AbortController of the streaming answer

function save() {
  store.set("conversations", conversations);
  store.set("current", current);
}

function conversation() {
  let c = conversations.find((c) => c.id === current);
  if (!c) {
    c = { id: `c${Date.now()}`, title: "New chat", model: $("#model").value || "", system: "", temperature: 0.7, messages: [] };
    conversations.unshift(c);
    current = c.id;
    save();
  }
  return c;
}

function renderConversations() {
  const ul = $("#conversations");
  ul.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    li.textContent = c.title;
    li.dataset.id = c.id;
    li.classList.toggle("current", c.id === current);
    li.onclick = () => {
      if (inFlight) return;
      current = c.id;
      save();
      renderChat();
    };
    const del = document.createElement("button");
    del.textContent = "×";
    del.title = "Delete this chat";
    del.className = "delete";
    del.onclick = (ev) => {
      ev.stopPropagation();
      conversations = conversations.filter((x) => x.id !== c.id);
      if (current === c.id) current = conversations[0] ? conversations[0].id : null;
      save();
      renderChat();
    };
    li.append(del);
    ul.append(li);
  }
}

// An assistant answer's parts: its reasoning (collapsed), its tool calls (name and
// arguments, readable), its text as markdown. Called again as the answer streams in.
function fillAnswer(div, m) {
  let details = div.querySelector("details.reasoning");
  if (m.reasoning && !details) {
    details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const text = document.createElement("div");
    text.className = "reasoning-text";
    details.append(summary, text);
    div.prepend(details);
  }
  if (details) details.querySelector(".reasoning-text").textContent = m.reasoning;
  let calls = div.querySelector(".tool-calls");
  if (m.tool_calls && m.tool_calls.length) {
    if (!calls) {
      calls = document.createElement("div");
      calls.className = "tool-calls";
      div.querySelector(".body").before(calls);
    }
    calls.replaceChildren(
      ...m.tool_calls.map((c) => {
        const el = document.createElement("div");
        el.className = "tool-call";
        const name = document.createElement("div");
        name.className = "tool-name";
        name.textContent = `Called ${c.name}`;
        const args = document.createElement("pre");
        let shown = c.arguments;
        try {
          shown = JSON.stringify(JSON.parse(c.arguments), null, 2);
        } catch (e) {
          // Still streaming, or not JSON: as it came.
        }
        args.textContent = shown;
        el.append(name, args);
        return el;
      }),
    );
  }
  div.querySelector(".body").innerHTML = renderMarkdown(m.content);
}

function messageEl(m) {
  const div = document.createElement("div");
  div.className = `msg ${m.role}${m.error ? " error" : ""}`;
  const body = document.createElement("div");
  body.className = "body";
  div.append(body);
  if (m.role === "assistant" && !m.error) fillAnswer(div, m);
  else body.textContent = m.content;
  if (m.stats) {
    const s = document.createElement("div");
    s.className = "stats";
    s.textContent = m.stats;
    div.append(s);
  }
  return div;
}

function renderChat() {
  const c = conversation();
  renderConversations();
  const box = $("#messages");
  box.replaceChildren(...c.messages.map(messageEl));
  box.scrollTop = box.scrollHeight;
  $("#system").value = c.system || "";
  $("#temperature").value = c.temperature ?? 0.7;
  if (c.model && [...$("#model").options].some((o) => o.value === c.model)) $("#model").value = c.model;
}

async function loadModelChoices() {
  try {
    const list = await api("/v1/models");
    const sel = $("#model");
    const keep = sel.value;
    // The chat picker offers the models that chat; embedding models are listed elsewhere.
    const chat = list.data.filter((m) => m.kind !== "embedding");
    sel.replaceChildren(...chat.map((m) => new Option(m.id + (m.loaded ? " (loaded)" : ""), m.id)));
    const c = conversations.find((c) => c.id === current);
    const def = lastStatus && lastStatus.default_model;
    sel.value = (c && c.model) || keep || def || (chat[0] && chat[0].id) || "";
  } catch (e) {
    setTimeout(loadModelChoices, 1000);
  }
}

function setBusy(busy) {
  $("#send").hidden = busy;
  $("#stop").hidden = !busy;
}

async function send(text) {
  const c = conversation();
  c.model = $("#model").value;
  c.system = $("#system").value;
  c.temperature = Number($("#temperature").value);
  if (c.messages.length === 0) c.title = text.slice(0, 40);
  c.messages.push({ role: "user", content: text });
  const answer = { role: "assistant", content: "" };
  c.messages.push(answer);
  save();
  renderChat();
  const el = $("#messages").lastElementChild;
  const body = el.querySelector(".body");
  // A model that is not loaded yet takes a while before its first token: say so.
  const option = $("#model").selectedOptions[0];
  if (option && !option.textContent.endsWith("(loaded)")) {
    body.textContent = `Loading ${c.model}…`;
    body.classList.add("loading");
  }
  const history = c.messages.slice(0, -1).filter((m) => !m.error).map((m) => ({ role: m.role, content: m.content }));
  if (c.system.trim()) history.unshift({ role: "system", content: c.system });
  inFlight = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstAt = null;
  let usage = null;
  let stopped = false;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      signal: inFlight.signal,
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model: c.model, messages: history, temperature: c.temperature, stream: true, stream_options: { include_usage: true } }),
    }).catch((e) => {
      if (e.name === "AbortError") throw e;
      throw new ApiError("Cannot reach the Perch engine. Is it running?", 0, "unreachable");
    });
    if (!resp.ok) throw await failure(resp);
    // A long prompt takes a while before its first token: say what is happening.
    const promptTokens = Number(resp.headers.get("x-perch-prompt-tokens") || 0);
    if (promptTokens >= 1000) {
      body.textContent = `Reading ${promptTokens.toLocaleString("en-US")} tokens…`;
      body.classList.add("loading");
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.message, 500, chunk.error.code);
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (!delta) continue;
        const calls = delta.tool_calls || [];
        if (!delta.content && !delta.reasoning_content && !calls.length) continue;
        if (firstAt === null) {
          firstAt = performance.now();
          body.classList.remove("loading");
        }
        answer.content += delta.content || "";
        if (delta.reasoning_content) answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
        for (const c of calls) {
          answer.tool_calls = answer.tool_calls || [];
          const call = (answer.tool_calls[c.index] = answer.tool_calls[c.index] || { name: "", arguments: "" });
          if (c.function && c.function.name) call.name = c.function.name;
          if (c.function && c.function.arguments) call.arguments += c.function.arguments;
        }
        fillAnswer(el, answer);
        $("#messages").scrollTop = $("#messages").scrollHeight;
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      stopped = true;
    } else {
      answer.error = true;
      answer.content = explain(e);
    }
  } finally {
    inFlight = null;
    setBusy(false);
  }
  if (!answer.error) {
    const secs = (performance.now() - (firstAt ?? started)) / 1000;
    const tokens = usage ? usage.completion_tokens : null;
    const rate = tokens && secs > 0 ? ` · ${(tokens / secs).toFixed(1)} tok/s` : "";
    const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
    const reused = cached ? ` · ${cached.toLocaleString("en-US")} prompt tokens reused` : "";
    answer.stats = stopped ? "stopped" + (answer.content || answer.reasoning ? "" : " before the first token") : `${tokens ?? "?"} tokens${rate}${reused}`;
  }
  save();
  renderChat();
}

$("#composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("#prompt").value.trim();
  if (!text || inFlight) return;
  $("#prompt").value = "";
  send(text);
});
$("#prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("#composer").requestSubmit();
  }
});
$("#stop").addEventListener("click", () => inFlight && inFlight.abort());
$("#new-chat").addEventListener("click", () => {
  if (inFlight) return;
  current = null;
  conversation();
  renderChat();
});
for (const [id, key] of [["#system", "system"], ["#temperature", "temperature"], ["#model", "model"]]) {
  $(id).addEventListener("change", () => {
    const c = conversation();
    c[key] = key === "temperature" ? Number($(id).value) : $(id).value;
    save();
  });
}

// ---- Models -----------------------------------------------------------------------------

function size(bytes) {
  if (!bytes) return "—";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (bytes >= 1000 && i < units.length - 1) {
    bytes /= 1000;
    i++;
  }
  return `${bytes.toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function loadModels() {
  const err = $("#models-error");
  try {
    const list = await api("/perch/models");
    $("#models-dir").textContent = `Installed in ${list.models_dir}` + (list.hf_cache ? `; also offered from ${list.hf_cache}` : "");
    const rows = list.data.map((m) => {
      const tr = document.createElement("tr");
      tr.dataset.id = m.id;
      for (const text of [m.id + (m.default ? " ★" : "") + (m.loaded ? " (loaded)" : ""), m.source, m.format, size(m.size_bytes)]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      const actions = document.createElement("td");
      const use = document.createElement("button");
      use.textContent = "Use";
      use.disabled = m.default;
      use.onclick = () => act(() => api("/perch/models/select", { method: "POST", body: { id: m.id } }));
      actions.append(use);
      if (m.source === "installed") {
        const del = document.createElement("button");
        del.textContent = "Delete";
        del.disabled = m.default;
        del.onclick = () => confirm(`Delete ${m.id} from disk?`) && act(() => api(`/perch/models/${encodeURIComponent(m.id)}`, { method: "DELETE" }));
        actions.append(del);
      }
      tr.append(actions);
      return tr;
    });
    $("#model-table tbody").replaceChildren(...rows);
    err.textContent = "";
  } catch (e) {
    err.textContent = explain(e);
  }
}

async function act(fn) {
  const err = $("#models-error");
  err.textContent = "";
  try {
    await fn();
  } catch (e) {
    err.textContent = explain(e);
  }
  loadModels();
  loadModelChoices();
}

const refreshedFor = new Set(); // finished downloads the model list already shows

async function pollDownloads() {
  if ($("#view-models").hidden) return;
  try {
    const list = await api("/perch/downloads");
    const items = list.data.map((d) => {
      const li = document.createElement("li");
      li.dataset.id = d.id;
      const pct = d.bytes_total ? Math.floor((100 * d.bytes_done) / d.bytes_total) : 0;
      const label = document.createElement("span");
      label.textContent = `${d.repo}: ${d.state}${d.state === "running" ? ` ${pct}% (${size(d.bytes_done)} of ${size(d.bytes_total)})` : ""}${d.error ? ` — ${d.error}` : ""}`;
      const bar = document.createElement("progress");
      bar.max = 100;
      bar.value = d.state === "done" ? 100 : pct;
      li.append(label, bar);
      if (d.state === "running") {
        const cancel = document.createElement("button");
        cancel.textContent = "Cancel";
        cancel.onclick = () => act(() => api(`/perch/downloads/${d.id}/cancel`, { method: "POST" }));
        li.append(cancel);
      }
      if (d.state === "failed") {
        const retry = document.createElement("button");
        retry.textContent = "Retry";
        retry.title = "Starts again, resuming from the parts already downloaded";
        retry.onclick = () => act(() => api("/perch/downloads", { method: "POST", body: { repo: d.repo } }));
        li.append(retry);
      }
      return li;
    });
    $("#downloads").replaceChildren(...items);
    const done = list.data.filter((d) => d.state === "done" && !refreshedFor.has(d.id));
    if (done.length) {
      done.forEach((d) => refreshedFor.add(d.id));
      loadModels();
      loadModelChoices();
    }
  } catch {}
}

$("#download-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  act(() => api("/perch/downloads", { method: "POST", body: { repo: $("#download-repo").value.trim() } }));
});
$("#import-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  act(() => api("/perch/models/import", { method: "POST", body: { path: $("#import-path").value.trim() } }));
});

// ---- Settings ---------------------------------------------------------------------------

let defaults = null;

function fill(settings) {
  const form = $("#settings-form");
  for (const el of form.elements) {
    if (!el.name) continue;
    const value = el.name.split(".").reduce((o, k) => (o ? o[k] : undefined), settings);
    if (el.type === "checkbox") el.checked = !!value;
    else if (Array.isArray(value)) el.value = value.join("\n");
    else el.value = value ?? "";
  }
}

function read() {
  const out = structuredClone(defaults || {});
  for (const el of $("#settings-form").elements) {
    if (!el.name) continue;
    const path = el.name.split(".");
    let target = out;
    for (const k of path.slice(0, -1)) target = target[k] ??= {};
    const key = path[path.length - 1];
    if (el.type === "checkbox") target[key] = el.checked;
    else if (el.type === "number") target[key] = el.value === "" ? null : Number(el.value);
    else if (el.name === "allowed_origins") target[key] = el.value.split("\n").map((s) => s.trim()).filter(Boolean);
    else target[key] = el.value;
  }
  return out;
}

async function loadSettings() {
  try {
    const c = await api("/perch/config");
    defaults = c.settings;
    $("#config-path").textContent = c.path;
    fill(c.settings);
    // The engine never sends the key back; it says whether one is set.
    $('#settings-form [name="api_key"]').placeholder = c.api_key_set ? "set (type a new one to replace it)" : "none";
    $("#clear-key").checked = false;
    $("#settings-error").textContent = c.error ? c.error.message : "";
  } catch (e) {
    $("#settings-error").textContent = e.status === 404 ? "Settings are edited in the desktop app, or with `perch serve --config FILE`." : explain(e);
  }
}

$("#settings-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const err = $("#settings-error");
  const progress = $("#settings-progress");
  err.textContent = "";
  for (const el of $("#settings-form").elements) el.classList.remove("invalid");
  progress.textContent = "Saving…";
  try {
    const body = read();
    // An empty key field keeps the key; removing it is said explicitly.
    if ($("#clear-key").checked) body.api_key = null;
    const r = await api("/perch/config", { method: "PUT", body });
    progress.textContent = r.restarted ? "Saved. The engine restarted with the new settings." : "Saved. Applied without a restart.";
    // A new port: this page's origin is gone; follow the engine.
    if (r.status && r.status.url && r.status.url !== location.origin) {
      location.href = `${r.status.url}/#settings`;
      return;
    }
    await pollStatus();
    loadModelChoices();
  } catch (e) {
    progress.textContent = "";
    err.textContent = explain(e);
    const field = e.param && document.querySelector(`#settings-form [name="${CSS.escape(e.param)}"]`);
    if (field) {
      field.classList.add("invalid");
      field.focus();
    }
  }
});

// ---- Start ------------------------------------------------------------------------------

showView();
renderChat();
pollStatus().then(loadModelChoices);
setInterval(pollStatus, 1500);
setInterval(pollDownloads, 500);
