// The UI by keyboard and as a screen reader reads it: a chat held with the keyboard alone
// (new chat, send, search, regenerate, stop), the Tab order through the chat view, a visible
// focus ring, and every control on every page named in Chromium's accessibility tree (what
// VoiceOver and Orca are given). Usage: node keyboard.mjs URL ARTIFACT_DIR
import { launch } from "./chromium.mjs";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "node:fs";

const [url, artifacts] = process.argv.slice(2);
fs.mkdirSync(artifacts, { recursive: true });
const step = (s) => console.log(`[keyboard] ${s}`);

const browser = await launch();
const page = await (await browser.newContext({ viewport: { width: 1100, height: 760 } })).newPage();
const errors = [];
page.on("pageerror", (e) => errors.push(String(e)));

// What has the focus, in words a failure message can show.
const focused = () =>
  page.evaluate(() => {
    const e = document.activeElement;
    if (!e || e === document.body) return "body";
    const name = e.id ? `#${e.id}` : e.className ? `.${String(e.className).split(" ")[0]}` : e.tagName.toLowerCase();
    return e.closest("#messages") ? `messages ${name}` : e.closest("#conversations") ? `list ${name}` : name;
  });

// Controls the accessibility tree gives no name: a screen reader would say only "button".
async function unnamed() {
  const cdp = await page.context().newCDPSession(page);
  const { nodes } = await cdp.send("Accessibility.getFullAXTree");
  await cdp.detach();
  const roles = new Set(["button", "textbox", "searchbox", "combobox", "checkbox", "link", "spinbutton", "slider", "progressbar", "ListBoxOption", "menuitem", "radio", "alertdialog", "dialog"]);
  return nodes
    .filter((n) => !n.ignored && roles.has(n.role?.value) && !(n.name?.value || "").trim())
    .map((n) => `${n.role.value}#${n.backendDOMNodeId}`);
}

try {
  await page.goto(`${url}/#chat`);
  await page.waitForFunction(() => document.querySelector("#status").dataset.phase === "running", null, { timeout: 60000 });

  // 1. A chat by keyboard alone: Alt+N puts the caret in the message box, Enter sends.
  await page.keyboard.press("Alt+N");
  assert.equal(await focused(), "#prompt", "Alt+N starts a chat with the caret in the message box");
  await page.keyboard.type("Hello from the keyboard");
  await page.keyboard.press("Enter");
  await page.locator(".msg.assistant .stats").last().waitFor({ timeout: 60000 });
  await page.keyboard.press("Control+K");
  assert.equal(await focused(), "#search", "Ctrl+K goes to the search field");
  step("new chat, send and search by keys");

  // 2. Tab order: from the top, through the header, the chat list, the chat's options, the
  // messages and their actions, to the message box and Send; only visible things take focus.
  await page.focus("header nav a");
  const order = [await focused()];
  for (let i = 0; i < 60; i++) {
    await page.keyboard.press("Tab");
    const f = await focused();
    const visible = await page.evaluate(() => {
      const r = document.activeElement.getBoundingClientRect();
      return r.width > 0 && r.height > 0 && getComputedStyle(document.activeElement).visibility !== "hidden";
    });
    assert.ok(visible || f === "body", `focus went to something not shown: ${f}`);
    order.push(f);
    if (f === "#send") break;
  }
  const at = (name) => {
    const i = order.findIndex((f) => f === name || f.startsWith(name));
    assert.ok(i >= 0, `${name} is never reached by Tab: ${order.join(" → ")}`);
    return i;
  };
  const landmarks = ["a", "#new-chat", "#search", "list .open", "#model", "#temperature", "#tools", "#preset", "summary", "messages .copy", "messages .regenerate", "#attach", "#prompt", "#send"];
  const positions = landmarks.map(at);
  assert.deepEqual([...positions].sort((a, b) => a - b), positions, `Tab order: ${order.join(" → ")}`);
  step(`Tab reaches ${order.length} controls in reading order: ${landmarks.join(" → ")}`);

  assert.equal(order.filter((f) => f.startsWith("list ")).length, 1, "the chat list is one Tab stop");

  // The list by arrows: Down to the next chat, Right to its actions, F2 renames it.
  await page.focus("#conversations .open[tabindex='0']");
  const rows = await page.locator("#conversations li[data-id]").count();
  if (rows > 1) {
    const second = await page.locator("#conversations li[data-id]").nth(1).getAttribute("data-id");
    await page.focus("#conversations li[data-id] .open >> nth=0");
    await page.keyboard.press("ArrowDown");
    assert.equal(await page.evaluate(() => document.activeElement.closest("li").dataset.id), second, "Down moves to the next chat");
  }
  await page.keyboard.press("ArrowRight");
  assert.equal(await focused(), "list .rename", "Right reaches the chat's actions");
  await page.keyboard.press("ArrowLeft");
  page.once("dialog", (d) => d.accept("Renamed by F2"));
  await page.keyboard.press("F2");
  await page.locator("#conversations li", { hasText: "Renamed by F2" }).waitFor({ timeout: 10000 });
  step(`the chat list is one Tab stop; arrows move through ${rows} chats and their actions; F2 renamed one`);

  // 3. The focus is visible where the keyboard put it.
  const ring = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
  assert.notEqual(ring, "none", "the focused control shows a focus ring");

  // 4. A message's actions work from the keyboard: Regenerate by Enter makes version 2/2;
  // Escape stops an answer.
  await page.focus("#prompt");
  let guard = 0;
  while ((await focused()) !== "messages .regenerate" && guard++ < 40) await page.keyboard.press("Shift+Tab");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector(".msg.assistant .branches .which")?.textContent === "2/2", null, { timeout: 60000 });
  await page.waitForFunction(() => document.querySelector("#stop").hidden, null, { timeout: 60000 });
  await page.keyboard.press("Alt+N"); // the fixture's answers fill its context: a new chat
  await page.keyboard.type("Tell me a very long story");
  await page.keyboard.press("Enter");
  await page.waitForFunction(
    () => [...document.querySelectorAll(".msg.user .body")].at(-1)?.textContent === "Tell me a very long story" && !document.querySelector("#stop").hidden,
    null,
    { timeout: 30000 },
  );
  await page.keyboard.press("Escape");
  await page.waitForFunction(() => document.querySelector("#stop").hidden, null, { timeout: 30000 });
  assert.equal(await page.locator(".msg.assistant").last().locator(".stats").textContent(), "stopped");
  step("regenerated with Enter on the message's action; Escape stopped an answer");

  // 5. Screen readers: answers are in a polite live region, notices in a status; every
  // control on every page has a name.
  assert.equal(await page.getAttribute("#messages", "aria-live"), "polite");
  assert.equal(await page.getAttribute("#chat-notice", "role"), "status");
  const missing = {};
  for (const view of ["chat", "models", "settings"]) {
    await page.goto(`${url}/#${view}`);
    await page.waitForFunction((v) => !document.querySelector(`#view-${v}`).hidden, view);
    await page.waitForTimeout(800); // lists filled from the engine
    const list = await unnamed();
    if (list.length) missing[view] = list;
  }
  await page.screenshot({ path: path.join(artifacts, "keyboard.png") });
  assert.deepEqual(missing, {}, "controls without an accessible name");
  assert.deepEqual(errors, [], "no script errors");
  step("every control of the chat, models and settings pages has an accessible name");
  console.log("[keyboard] all checks passed");
} catch (e) {
  await page.screenshot({ path: path.join(artifacts, "keyboard-failure.png") }).catch(() => {});
  console.error(e);
  process.exitCode = 1;
} finally {
  await browser.close();
}
