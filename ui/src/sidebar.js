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
  const list = $("#conversations");
  const hadFocus = list.contains(document.activeElement) ? document.activeElement.closest("li")?.dataset.id : null;
  list.replaceChildren(...items);
  // One Tab stop for the whole list (the chat shown, else the first): arrows move within.
  for (const b of list.querySelectorAll("button")) b.tabIndex = -1;
  const entry = list.querySelector(`li[data-id="${CSS.escape(hadFocus || current || "")}"] .open`) || list.querySelector(".open");
  if (entry) entry.tabIndex = 0;
  if (hadFocus && entry) entry.focus();
  $("#kept").hidden = store.kept;
}

// Keys in the list: Up/Down (Home/End) move between chats, Right/Left through a chat's
// actions, F2 renames, Delete deletes. Tab leaves the list in one step.
function listKeys(ev) {
  const button = ev.target.closest("button");
  const li = button && button.closest("li");
  if (!li) return;
  const rows = [...$("#conversations").querySelectorAll("li[data-id]")];
  const inRow = [...li.querySelectorAll("button")];
  let to = null;
  const row = (i) => rows[Math.max(0, Math.min(rows.length - 1, i))].querySelector(".open");
  switch (ev.key) {
    case "ArrowDown":
      to = row(rows.indexOf(li) + 1);
      break;
    case "ArrowUp":
      to = row(rows.indexOf(li) - 1);
      break;
    case "Home":
      to = row(0);
      break;
    case "End":
      to = row(rows.length - 1);
      break;
    case "ArrowRight":
      to = inRow[Math.min(inRow.length - 1, inRow.indexOf(button) + 1)];
      break;
    case "ArrowLeft":
      to = inRow[Math.max(0, inRow.indexOf(button) - 1)];
      break;
    case "F2":
      to = li.querySelector(".rename");
      to.click();
      break;
    case "Delete":
      to = li.querySelector(".delete");
      to.click();
      break;
    default:
      return;
  }
  ev.preventDefault();
  for (const b of $("#conversations").querySelectorAll("button")) b.tabIndex = -1;
  to.tabIndex = 0;
  to.focus();
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
  $("#conversations").addEventListener("keydown", listKeys);
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
