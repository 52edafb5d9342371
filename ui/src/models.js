// The models page: what is installed (and offered from the Hugging Face cache), downloads
// from the hub with progress, cancel and retry, GGUF imports.
import { $, api, explain } from "./api.js";
import { loadModelChoices } from "./chat.js";
import { defaultModel } from "./status.js";

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

export async function loadModels() {
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
  loadModelChoices(defaultModel());
}

const refreshedFor = new Set(); // finished downloads the model list already shows

export async function pollDownloads() {
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
      bar.setAttribute("aria-label", `Download of ${d.repo}`);
      li.append(label, bar);
      if (d.state === "running") {
        const cancel = document.createElement("button");
        cancel.textContent = "Cancel";
        cancel.setAttribute("aria-label", `Cancel downloading ${d.repo}`);
        cancel.onclick = () => act(() => api(`/perch/downloads/${d.id}/cancel`, { method: "POST" }));
        li.append(cancel);
      }
      if (d.state === "failed") {
        const retry = document.createElement("button");
        retry.textContent = "Retry";
        retry.setAttribute("aria-label", `Retry downloading ${d.repo}`);
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
      loadModelChoices(defaultModel());
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

