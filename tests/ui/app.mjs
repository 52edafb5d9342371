// The real desktop app in a real window: tauri-driver + WebKitWebDriver launch the built
// `perch-app` (under Xvfb and a D-Bus session, see engine/tests/app_window.rs), and this
// script speaks plain WebDriver to it: the chat window opens, the engine comes up, a message
// gets an answer. Usage: node app.mjs APP_BINARY ARTIFACT_DIR
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const [app, artifacts] = process.argv.slice(2);
fs.mkdirSync(artifacts, { recursive: true });
const port = 4444 + Math.floor(Math.random() * 1000);
const driverBin = process.env.TAURI_DRIVER || "tauri-driver";
const driver = spawn(driverBin, ["--port", String(port), "--native-port", String(port + 1000)], { stdio: ["ignore", "inherit", "inherit"] });
const base = `http://127.0.0.1:${port}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const step = (s) => console.log(`[app] ${s}`);

async function wd(method, url, body) {
  const r = await fetch(base + url, { method, headers: { "Content-Type": "application/json" }, body: body && JSON.stringify(body) });
  const j = await r.json();
  if (!r.ok || (j.value && j.value.error)) throw new Error(`${method} ${url}: ${JSON.stringify(j)}`);
  return j.value;
}

async function until(what, fn, timeoutMs = 90000) {
  const t = Date.now();
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      if (Date.now() - t > timeoutMs) throw e;
    }
    if (Date.now() - t > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await sleep(250);
  }
}

let session = null;
try {
  await until("tauri-driver", () => fetch(`${base}/status`).then((r) => r.ok), 20000);
  const s = await wd("POST", "/session", { capabilities: { alwaysMatch: { "tauri:options": { application: app } } } });
  session = s.sessionId;
  const S = `/session/${session}`;
  const find = async (css) => Object.values(await wd("POST", `${S}/element`, { using: "css selector", value: css }))[0];
  const text = async (css) => wd("GET", `${S}/element/${await find(css)}/text`);
  const js = (script) => wd("POST", `${S}/execute/sync`, { script, args: [] });

  const url = await until("the chat window", async () => {
    const u = await wd("GET", `${S}/url`);
    return /^http:\/\/127\.0\.0\.1:\d+\/#chat$/.test(u) && u;
  });
  step(`the chat window shows the engine's UI at ${url}`);
  await until("the engine to run", async () => (await js("return document.querySelector('#status').dataset.phase")) === "running");
  step(`status: ${await text("#status")}`);

  await wd("POST", `${S}/element/${await find("#prompt")}/value`, { text: "Hello from the window" });
  await wd("POST", `${S}/element/${await find("#send")}/click`, {});
  const stats = await until("the answer", async () => {
    const t = await js("const s = document.querySelectorAll('.msg.assistant .stats'); return s.length ? s[s.length - 1].textContent : ''");
    return /tok\/s/.test(t) && t;
  });
  const answer = await js("const b = document.querySelectorAll('.msg.assistant .body'); return b[b.length - 1].textContent");
  if (!answer || answer.length === 0) throw new Error("empty answer");
  step(`answered (${stats}): ${JSON.stringify(answer.slice(0, 60))}…`);
  // The engine kept it: the sidebar lists it, and opening it shows the exchange again.
  await until("the chat in the list", async () => (await js("return [...document.querySelectorAll('#conversations li button.open')].map((b) => b.textContent).join('|')")).includes("Hello from the window"));
  await js("document.querySelector('#new-chat').click(); return true");
  await wd("POST", `${S}/element/${await find("#conversations li button.open")}/click`, {});
  await until("the conversation to open", async () => (await js("const u = document.querySelector('.msg.user .body'); return u ? u.textContent : ''")) === "Hello from the window");
  step("the chat is listed and opens again");
  const png = await wd("GET", `${S}/screenshot`);
  fs.writeFileSync(path.join(artifacts, "app-chat-window.png"), Buffer.from(png, "base64"));
  step("screenshot saved");
  console.log("[app] the desktop app's chat window answered");
} catch (e) {
  console.error(e);
  process.exitCode = 1;
} finally {
  if (session) await wd("DELETE", `/session/${session}`).catch(() => {});
  driver.kill();
}
