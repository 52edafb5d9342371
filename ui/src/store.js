// The conversations, kept by the engine (/perch/conversations): the app window and a
// browser tab share them, and they outlive a reload, a restart and a cleared webview.
// A server that keeps none (`perch serve --conversations-dir none`) leaves them in memory,
// and the page says so.
import { api, request, ApiError, prefs } from "./api.js";
import { newId } from "./tree.js";

const BASE = "/perch/conversations";
export let kept = true; // false: the engine keeps no conversations

export function blank(model) {
  return { id: newId().replace(/[^A-Za-z0-9_-]/g, ""), title: "New chat", revision: 0, settings: { model: model || "", system: "", temperature: 0.7 }, messages: [], current: null };
}

const memory = new Map(); // id -> conversation, when the engine keeps none

function off(e) {
  if (e instanceof ApiError && e.code === "conversations_off") {
    kept = false;
    return true;
  }
  return false;
}

export async function list(query = "") {
  try {
    const r = await api(query ? `${BASE}?q=${encodeURIComponent(query)}` : BASE);
    return { data: r.data, damaged: r.damaged || [] };
  } catch (e) {
    if (!off(e)) throw e;
    const q = query.toLowerCase();
    const data = [...memory.values()]
      .filter((c) => !q || c.title.toLowerCase().includes(q) || c.messages.some((m) => m.content.toLowerCase().includes(q)))
      .map((c) => ({ id: c.id, title: c.title, updated_ms: c.updated_ms || 0, messages: c.messages.length }));
    return { data, damaged: [] };
  }
}

export async function load(id) {
  if (!kept) return structuredClone(memory.get(id));
  return api(`${BASE}/${encodeURIComponent(id)}`);
}

// Save `c` and take the stored revision and times; another window's newer save is not
// overwritten (409 `conflict`: the caller reloads).
export async function save(c) {
  if (!kept) {
    c.updated_ms = Date.now();
    memory.set(c.id, structuredClone(c));
    return c;
  }
  try {
    const stored = await api(`${BASE}/${encodeURIComponent(c.id)}`, { method: "PUT", body: c });
    Object.assign(c, { revision: stored.revision, created_ms: stored.created_ms, updated_ms: stored.updated_ms });
    return c;
  } catch (e) {
    if (off(e)) return save(c);
    throw e;
  }
}

export async function rename(id, title) {
  if (!kept) {
    memory.get(id).title = title;
    return;
  }
  await api(`${BASE}/${encodeURIComponent(id)}`, { method: "PATCH", body: { title } });
}

export async function remove(id) {
  if (!kept) return memory.delete(id);
  await api(`${BASE}/${encodeURIComponent(id)}`, { method: "DELETE" });
}

// Save a file the engine exports (with the API key, which a plain link would not send).
export async function download(path) {
  const resp = await request(path);
  const name = /filename="([^"]+)"/.exec(resp.headers.get("content-disposition") || "")?.[1] || "perch-export";
  const url = URL.createObjectURL(await resp.blob());
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

export const exportPath = (id, format) => `${BASE}/${encodeURIComponent(id)}/export?format=${format}`;
export const exportAllPath = () => `${BASE}/export`;

// A file the user picked: our JSON export (one conversation or all), or Markdown.
export async function importFile(file) {
  const text = await file.text();
  let body;
  if (/\.(md|markdown|txt)$/i.test(file.name)) body = { markdown: text };
  else {
    let v;
    try {
      v = JSON.parse(text);
    } catch {
      throw new ApiError(`${file.name} is neither JSON nor Markdown (.md)`, 400, "invalid_json");
    }
    body = Array.isArray(v.conversations) ? { conversations: v.conversations } : { conversation: v };
  }
  return api(`${BASE}/import`, { method: "POST", body });
}

// Chats an older Perch kept in this page's storage move to the engine once.
export async function migrateLocal() {
  const old = prefs.get("conversations", null);
  if (!Array.isArray(old) || !old.length || !kept) return 0;
  const conversations = old.map((c) => {
    const out = blank(c.model);
    out.title = String(c.title || "Chat").slice(0, 200);
    out.settings.system = c.system || "";
    if (typeof c.temperature === "number") out.settings.temperature = c.temperature;
    let parent = null;
    for (const m of c.messages || []) {
      const id = newId();
      const msg = { id, parent, role: m.role === "user" ? "user" : "assistant", content: String(m.content || "") };
      if (m.reasoning) msg.reasoning = String(m.reasoning);
      if (m.error) msg.error = String(m.content || "failed");
      out.messages.push(msg);
      parent = id;
    }
    out.current = parent;
    return out;
  });
  await api(`${BASE}/import`, { method: "POST", body: { conversations } });
  localStorage.removeItem("perch.conversations");
  localStorage.removeItem("perch.current");
  return conversations.length;
}
