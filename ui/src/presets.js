// Named presets of a chat's settings (system prompt, temperature, top-p, max tokens, MCP
// tools), kept by the engine beside the conversations so every window offers the same ones.
// Choosing one sets the chat's options; the chat keeps its model.
import { $, api, explain } from "./api.js";
import * as chat from "./chat.js";

const PATH = "/perch/conversations/presets";
let presets = [];

const path = (name) => `${PATH}/${encodeURIComponent(name)}`;

function show() {
  const sel = $("#preset");
  const keep = sel.value;
  sel.replaceChildren(new Option("none", ""), ...presets.map((p) => new Option(p.name, p.name)));
  sel.value = presets.some((p) => p.name === keep) ? keep : "";
  $("#delete-preset").disabled = !sel.value;
}

export async function load() {
  try {
    presets = (await api(PATH)).presets;
    $("#presets").hidden = false;
  } catch (e) {
    // A server that keeps no conversations keeps no presets either.
    $("#presets").hidden = e.code === "conversations_off";
    presets = [];
  }
  show();
}

// A chat opened or started: no preset is shown as chosen for it.
export function reset() {
  $("#preset").value = "";
  $("#delete-preset").disabled = true;
}

function choose() {
  const p = presets.find((x) => x.name === $("#preset").value);
  $("#delete-preset").disabled = !p;
  if (!p) return;
  chat.applySettings(p.settings);
  chat.status(`Preset “${p.name}” applied.`);
}

async function save() {
  const name = prompt("Save this chat's system prompt, sampling and tools as a preset named:", $("#preset").value);
  if (name === null || !name.trim()) return;
  const { model, ...settings } = chat.currentSettings(); // the chat keeps its model
  try {
    presets = (await api(path(name.trim()), { method: "PUT", body: { settings } })).presets;
    show();
    const saved = presets.find((p) => p.name.toLowerCase() === name.trim().toLowerCase());
    if (saved) $("#preset").value = saved.name;
    $("#delete-preset").disabled = false;
    chat.status(`Saved preset “${name.trim()}”.`);
  } catch (e) {
    chat.status(explain(e));
  }
}

async function remove() {
  const name = $("#preset").value;
  if (!name) return;
  try {
    presets = (await api(path(name), { method: "DELETE" })).presets;
    chat.status(`Deleted preset “${name}”.`);
  } catch (e) {
    chat.status(explain(e));
  }
  show();
}

export function wire() {
  $("#preset").addEventListener("change", choose);
  $("#save-preset").addEventListener("click", save);
  $("#delete-preset").addEventListener("click", remove);
  chat.onOpen(reset);
  // Another window's new presets, when this one comes back to the front.
  window.addEventListener("focus", load);
}

