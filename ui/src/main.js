// Perch's pages: chat, models and settings. They talk to the engine only over HTTP, so the
// same page runs in the desktop app's window and in any browser.
import "./style.css";
import { $ } from "./api.js";
import * as chat from "./chat.js";
import { renderMarkdown } from "./markdown.js";
import { loadModels, pollDownloads } from "./models.js";
import * as presets from "./presets.js";
import { loadSettings } from "./settings.js";
import * as sidebar from "./sidebar.js";
import { defaultModel, pollStatus } from "./status.js";
import * as store from "./store.js";

// For the browser tests' safety corpus: the renderer the chat uses, nothing else.
window.renderMarkdown = renderMarkdown;

function showView() {
  const name = (location.hash || "#chat").slice(1);
  for (const v of ["chat", "models", "settings"]) {
    $(`#view-${v}`).hidden = v !== name;
    const link = document.querySelector(`nav a[data-view=${v}]`);
    link.classList.toggle("active", v === name);
    if (v === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (name === "models") loadModels();
  if (name === "settings") loadSettings();
}
window.addEventListener("hashchange", showView);

$("#composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("#prompt").value.trim();
  if (!text || chat.busy()) return;
  $("#prompt").value = "";
  chat.send(text);
});
$("#prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    $("#composer").requestSubmit();
  }
});
$("#stop").addEventListener("click", chat.stop);
$("#new-chat").addEventListener("click", chat.newChat);
$("#attach").addEventListener("click", () => $("#attach-file").click());
$("#attach-file").addEventListener("change", (ev) => {
  chat.attach([...ev.target.files]);
  ev.target.value = "";
});
for (const id of ["#system", "#temperature", "#top-p", "#max-tokens", "#model", "#tools"]) $(id).addEventListener("change", chat.optionChanged);

// Keyboard: Escape stops an answer, Alt+N starts a chat, Ctrl/Cmd+K searches the chats.
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && chat.busy()) chat.stop();
  else if (ev.altKey && ev.key.toLowerCase() === "n") {
    ev.preventDefault();
    chat.newChat();
  } else if ((ev.ctrlKey || ev.metaKey) && ev.key.toLowerCase() === "k") {
    ev.preventDefault();
    $("#search").focus();
  }
});

// KaTeX arrived (the first answer with math): show the answers on screen with it. An answer
// still streaming gets it with its next blocks, and whole when it ends.
document.addEventListener("math-ready", () => chat.busy() || chat.render());

sidebar.wire();
presets.wire();
showView();
chat.render();
pollStatus().then(async () => {
  await chat.loadModelChoices(defaultModel());
  try {
    const moved = await store.migrateLocal();
    if (moved) chat.status(`Moved ${moved} chat${moved === 1 ? "" : "s"} from this page's storage into Perch.`);
  } catch {}
  await sidebar.refresh();
  await presets.load();
});
chat.reopen().then(sidebar.refresh);
setInterval(pollStatus, 1500);
setInterval(pollDownloads, 500);
// Another window's new or changed chats.
setInterval(() => document.visibilityState === "visible" && !chat.busy() && sidebar.refresh(), 3000);
