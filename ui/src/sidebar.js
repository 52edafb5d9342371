// The conversation list: search, open, rename, delete, export (JSON or Markdown, one or
// all) and import. Another window's changes show at the next refresh.
import { $, el, explain } from "./api.js";
import * as chat from "./chat.js";
import * as store from "./store.js";

let query = "";
let timer = 0;
let shownSignature = "";

export async function refresh() {
  let r;
  try {
    r = await store.list(query);
  } catch (e) {
    chat.status(explain(e));
    return;
  }
  const current = chat.currentId();
  // Unchanged: leave the list as it is (no flicker, and a click on it lands where aimed).
  const signature = JSON.stringify([current, r.data, r.damaged]);
  if (signature === shownSignature) return;
  shownSignature = signature;
  const items = r.data.map((c) => {
    const li = el("li", { "data-id": c.id, class: c.id === current ? "current" : "" });
    const open = el("button", { type: "button", class: "open", title: c.title, onclick: () => chat.open(c.id) }, el("span", { class: "title", text: c.title }));
    if (c.snippet && c.snippet !== c.title) open.append(el("span", { class: "snippet", text: c.snippet }));
    if (c.id === current) open.setAttribute("aria-current", "true");
    const menu = el(
      "span",
      { class: "item-actions" },
      el("button", { type: "button", class: "rename", text: "✎", title: "Rename", "aria-label": `Rename ${c.title}`, onclick: () => rename(c) }),
      el("button", { type: "button", class: "export", text: "⇩", title: "Export as Markdown", "aria-label": `Export ${c.title} as Markdown`, onclick: () => exportOne(c.id, "markdown") }),
      el("button", { type: "button", class: "export-json", text: "{}", title: "Export as JSON", "aria-label": `Export ${c.title} as JSON`, onclick: () => exportOne(c.id, "json") }),
      el("button", { type: "button", class: "delete", text: "×", title: "Delete", "aria-label": `Delete ${c.title}`, onclick: () => remove(c) }),
    );
    li.append(open, menu);
    return li;
  });
  for (const d of r.damaged) items.push(el("li", { class: "damaged", text: `⚠ ${d.message}` }));
  $("#conversations").replaceChildren(...items);
  $("#kept").hidden = store.kept;
}

async function rename(c) {
  const title = prompt("Rename this chat:", c.title);
  if (title === null || !title.trim()) return;
  try {
    await store.rename(c.id, title.trim().slice(0, 200));
    if (c.id === chat.currentId()) await chat.open(c.id);
  } catch (e) {
    chat.status(explain(e));
  }
  refresh();
}

async function remove(c) {
  if (chat.busy() && c.id === chat.currentId()) return;
  if (!confirm(`Delete “${c.title}”? This cannot be undone.`)) return;
  try {
    await store.remove(c.id);
    if (c.id === chat.currentId()) chat.newChat();
  } catch (e) {
    chat.status(explain(e));
  }
  refresh();
}

async function exportOne(id, format) {
  try {
    await store.download(store.exportPath(id, format));
  } catch (e) {
    chat.status(explain(e));
  }
}

export function wire() {
  $("#search").addEventListener("input", (ev) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      query = ev.target.value.trim();
      refresh();
    }, 150);
  });
  $("#export-all").addEventListener("click", () => store.download(store.exportAllPath()).catch((e) => chat.status(explain(e))));
  $("#import").addEventListener("click", () => $("#import-file").click());
  $("#import-file").addEventListener("change", async (ev) => {
    const files = [...ev.target.files];
    ev.target.value = "";
    let n = 0;
    for (const f of files) {
      try {
        n += (await store.importFile(f)).imported.length;
      } catch (e) {
        chat.status(`${f.name}: ${explain(e)}`);
      }
    }
    if (n) chat.status(`Imported ${n} chat${n === 1 ? "" : "s"}.`);
    refresh();
  });
  chat.onListChange(refresh);
}
