// The settings page: the settings file's fields, saved through the engine (which restarts
// itself when a field needs it), errors shown at the field.
import { $, api, explain } from "./api.js";
import { loadModelChoices } from "./chat.js";
import { pollStatus, defaultModel } from "./status.js";

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

// The MCP servers file, edited as text and checked by the engine before it is written.
function showMcp(m) {
  $("#mcp-path").textContent = m.path;
  $("#mcp-text").value = m.text;
  $("#mcp-error").textContent = m.error ? m.error.message : "";
  $("#mcp-servers").replaceChildren(
    ...m.servers.map((s) => {
      const li = document.createElement("li");
      li.textContent = `${s.name} (${s.transport})${s.disabled ? " — disabled" : s.running ? " — running" : ""}${s.always_allow.length ? ` · always allowed: ${s.always_allow.join(", ")}` : ""}`;
      return li;
    }),
  );
}

async function loadMcp() {
  try {
    showMcp(await api("/perch/mcp"));
    $("#mcp-form").hidden = false;
  } catch (e) {
    $("#mcp-form").hidden = e.status === 404;
    $("#mcp-error").textContent = explain(e);
  }
}

$("#mcp-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("#mcp-error").textContent = "";
  try {
    showMcp(await api("/perch/mcp", { method: "PUT", body: { text: $("#mcp-text").value } }));
    $("#mcp-error").textContent = "";
  } catch (e) {
    $("#mcp-error").textContent = explain(e);
  }
});

export async function loadSettings() {
  loadMcp();
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
    loadModelChoices(defaultModel());
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

