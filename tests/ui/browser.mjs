// Perch's UI in a real browser: Debian's chromium, headless, driven by playwright-core,
// against an engine serving the UI with a fixture model (engine/tests/ui_browser.rs starts
// it). Usage: node browser.mjs URL CONFIG_FILE ARTIFACT_DIR
import { chromium } from "playwright-core";
import fs from "node:fs";
import path from "node:path";
import assert from "node:assert/strict";
import net from "node:net";

const [url, configFile, artifacts] = process.argv.slice(2);
fs.mkdirSync(artifacts, { recursive: true });
fs.rmSync(path.join(artifacts, "failure.png"), { force: true }); // from an earlier run
const shot = (page, name) => page.screenshot({ path: path.join(artifacts, name), fullPage: true });
const step = (s) => console.log(`[ui] ${s}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
const page = await context.newPage();
const errors = [];
page.on("pageerror", (e) => errors.push(String(e)));

async function health() {
  return page.evaluate(() => fetch("/health").then((r) => r.json()));
}

async function waitRunning() {
  await page.waitForFunction(() => document.querySelector("#status").dataset.phase === "running", null, { timeout: 60000 });
}

try {
  await page.goto(`${url}/#chat`);
  await waitRunning();
  step("the page loaded and the engine runs");

  // 0. Answers render as markdown, safely: code blocks keep their text, HTML stays text.
  const md = await page.evaluate(() =>
    renderMarkdown("# Title\n```js\nlet a = '<b>x</b>';\n```\n**bold** and `code <i>` and [ok](https://example.com) [bad](javascript:alert(1))\n- one\n- two"),
  );
  assert.ok(md.includes('<pre data-lang="js"><code>let a = &#39;&lt;b&gt;x&lt;/b&gt;&#39;;</code></pre>'), md);
  assert.ok(md.includes("<strong>bold</strong>") && md.includes("<code>code &lt;i&gt;</code>"), md);
  assert.ok(md.includes('<a href="https://example.com" target="_blank" rel="noopener noreferrer">ok</a>'), md);
  assert.ok(!md.includes('href="javascript'), `no script links: ${md}`);
  assert.ok(md.includes("<ul><li>one</li><li>two</li></ul>") && md.includes("<h3>Title</h3>"), md);
  step("markdown renders code, emphasis, links and lists, and keeps HTML as text");

  // 1. A chat answer streams in, and the token rate shows after it.
  await page.fill("#prompt", "Hello there");
  await page.press("#prompt", "Enter");
  const answer = page.locator(".msg.assistant").last();
  await page.waitForFunction(() => {
    const b = document.querySelectorAll(".msg.assistant .body");
    return b.length && b[b.length - 1].textContent.length > 0 && !document.querySelector("#stop").hidden;
  }, null, { timeout: 30000 });
  step("text is streaming (stop button shown while it does)");
  await answer.locator(".stats").waitFor({ timeout: 60000 });
  const stats = await answer.locator(".stats").textContent();
  assert.match(stats, /\d+ tokens · [\d.]+ tok\/s/, `stats line: ${stats}`);
  assert.ok((await answer.locator(".body").textContent()).length > 0);
  await shot(page, "chat-answer.png");
  step(`answered: ${stats}`);

  // 2. The fixture answered up to its whole context: the next turn cannot fit, and the UI
  // says so instead of failing silently.
  await page.fill("#prompt", "And then?");
  await page.press("#prompt", "Enter");
  await page.locator(".msg.assistant.error").waitFor({ timeout: 30000 });
  const full = await page.locator(".msg.assistant.error").textContent();
  assert.match(full, /no longer fits the model's context/, full);
  await shot(page, "chat-context-full.png");
  step(`a full context is explained: ${full.slice(0, 80)}…`);

  // 3. Stop mid-stream (in a new chat): the text stops growing, the engine frees the request.
  await page.click("#new-chat");
  await page.fill("#prompt", "Tell me a very long story");
  await page.press("#prompt", "Enter");
  await page.waitForFunction(() => {
    const b = document.querySelectorAll(".msg.assistant .body");
    return b.length === 1 && b[0].textContent.length > 20;
  }, null, { timeout: 30000 });
  await page.click("#stop");
  await page.locator(".msg.assistant").last().locator(".stats").waitFor();
  assert.equal(await page.locator(".msg.assistant").last().locator(".stats").textContent(), "stopped");
  const stoppedText = await page.locator(".msg.assistant").last().locator(".body").textContent();
  await page.waitForTimeout(500);
  assert.equal(await page.locator(".msg.assistant").last().locator(".body").textContent(), stoppedText, "no text after stop");
  assert.ok(await page.locator("#send").isVisible(), "ready for the next message");
  for (let i = 0; ; i++) {
    const h = await health();
    if (h.foreground_active === 0 && h.leases.total === 0) break;
    assert.ok(i < 100, `the engine still runs the stopped request: ${JSON.stringify(h)}`);
    await page.waitForTimeout(50);
  }
  await shot(page, "chat-stopped.png");
  step(`stopped after ${stoppedText.length} characters; the engine is idle again`);

  // 4. Reload: the conversation is still there.
  await page.reload();
  await waitRunning();
  const item = page.locator("#conversations li", { hasText: "Hello there" });
  await item.waitFor();
  await item.click();
  assert.equal(await page.locator(".msg.user").first().textContent(), "Hello there");
  assert.equal(await page.locator(".msg.assistant").count(), 2);
  step("the conversation survived a reload");

  // 5. A setting that needs a restart: the engine restarts and comes back.
  const before = await page.evaluate(() => fetch("/perch/status").then((r) => r.json()));
  await page.goto(`${url}/#settings`);
  await page.waitForFunction(() => document.querySelector("#config-path").textContent.length > 0);
  await page.selectOption("select[name=draft]", "lookup");
  await page.click("#save-settings");
  await page.waitForFunction(() => /restarted/.test(document.querySelector("#settings-progress").textContent), null, { timeout: 60000 });
  await waitRunning();
  const after = await page.evaluate(() => fetch("/perch/status").then((r) => r.json()));
  assert.equal(after.restarts, before.restarts + 1);
  assert.equal((await health()).draft, "lookup");
  assert.match(fs.readFileSync(configFile, "utf8"), /draft = "lookup"/);
  await shot(page, "settings-restarted.png");
  step("saved a setting; the engine restarted and serves with it");

  // 6. An invalid setting: a clear error at the field, nothing restarts.
  await page.fill("input[name=port]", "80");
  await page.click("#save-settings");
  await page.waitForFunction(() => document.querySelector("#settings-error").textContent.includes("port"));
  const err = await page.locator("#settings-error").textContent();
  assert.match(err, /1024 to 65535/);
  assert.ok(await page.locator("input[name=port].invalid").count(), "the field is marked");
  assert.doesNotMatch(fs.readFileSync(configFile, "utf8"), /port = 80\n/);
  await shot(page, "settings-invalid.png");
  step(`invalid port refused: ${err}`);

  // 7. A hand edit that breaks the file: the banner says so, the old engine keeps serving.
  const good = fs.readFileSync(configFile, "utf8");
  fs.writeFileSync(configFile, good.replace('draft = "lookup"', 'draft = "turbo"'));
  await page.locator("#banner").filter({ hasText: "draft" }).waitFor({ timeout: 30000 });
  await shot(page, "settings-hand-edit-invalid.png");
  await page.goto(`${url}/#chat`);
  await waitRunning();
  await page.click("#new-chat");
  await page.fill("#prompt", "Still there?");
  await page.press("#prompt", "Enter");
  await page.locator(".msg.assistant").last().locator(".stats").waitFor({ timeout: 60000 });
  assert.match(await page.locator(".msg.assistant").last().locator(".stats").textContent(), /tok\/s/);
  fs.writeFileSync(configFile, good);
  await page.locator("#banner").waitFor({ state: "hidden", timeout: 30000 });
  step("an invalid hand edit showed a banner while chat kept working; fixing it cleared it");

  // 8. Models page: the installed models with size and format.
  await page.goto(`${url}/#models`);
  await page.locator("#model-table tbody tr").first().waitFor();
  const rows = await page.locator("#model-table tbody tr").allTextContents();
  assert.ok(rows.some((r) => r.includes("chat") && r.includes("MB")), rows.join(" | "));
  const cached = rows.find((r) => r.includes("perch-test/cached-qwen3"));
  assert.ok(cached && cached.includes("hf-cache"), `the Hugging Face cache model is offered: ${rows.join(" | ")}`);
  await shot(page, "models.png");
  step(`models page: ${rows.length} models, one from the Hugging Face cache`);

  // 9. Downloads: cancel one mid-way, then download it fully; a missing repo fails clearly.
  await page.fill("#download-repo", "perch-test/tiny-qwen3");
  await page.click("#download-form button");
  const dl = page.locator("#downloads li").last();
  await page.waitForFunction(() => {
    const li = [...document.querySelectorAll("#downloads li")].pop();
    return li && /running [1-9]\d*%/.test(li.textContent);
  }, null, { timeout: 30000 });
  await shot(page, "download-progress.png");
  await dl.locator("button", { hasText: "Cancel" }).click();
  await page.locator("#downloads li", { hasText: "cancelled" }).waitFor({ timeout: 30000 });
  step("a download showed its progress and was cancelled");
  await page.fill("#download-repo", "perch-test/tiny-qwen3");
  await page.click("#download-form button");
  await page.locator("#downloads li", { hasText: "done" }).waitFor({ timeout: 60000 });
  await page.locator("#model-table tbody tr", { hasText: "tiny-qwen3" }).first().waitFor({ timeout: 10000 });
  await page.fill("#download-repo", "perch-test/no-such-model");
  await page.click("#download-form button");
  await page.locator("#downloads li", { hasText: "was not found" }).waitFor({ timeout: 30000 });
  await shot(page, "downloads.png");
  step("downloaded a model from the hub; a missing repo says so");

  // 10. Chat with the cached model, loaded in place.
  await page.goto(`${url}/#chat`);
  await waitRunning();
  await page.click("#new-chat");
  await page.selectOption("#model", "perch-test/cached-qwen3");
  await page.fill("#prompt", "Hi");
  await page.press("#prompt", "Enter");
  await page.locator(".msg.assistant").last().locator(".stats").waitFor({ timeout: 60000 });
  assert.match(await page.locator(".msg.assistant").last().locator(".stats").textContent(), /tokens/);
  assert.equal((await health()).model.id, "perch-test/cached-qwen3");
  step("chatted with the Hugging Face cache model");

  // 10b. A model that thinks (its template opens <think>): the reasoning shows collapsed,
  // apart from the answer, and stays there after a reload.
  await page.click("#new-chat");
  await page.selectOption("#model", "thinker");
  await page.fill("#prompt", "Hi");
  await page.press("#prompt", "Enter");
  const thought = page.locator(".msg.assistant").last();
  await thought.locator(".stats").waitFor({ timeout: 60000 });
  const reasoning = thought.locator("details.reasoning");
  assert.equal(await reasoning.count(), 1, "no reasoning block");
  assert.equal(await reasoning.evaluate((d) => d.open), false, "reasoning is not collapsed");
  assert.ok((await reasoning.locator(".reasoning-text").textContent()).length > 0);
  assert.ok(!(await thought.locator(".body").textContent()).includes("<think>"));
  await reasoning.locator("summary").click();
  assert.equal(await reasoning.evaluate((d) => d.open), true);
  await shot(page, "chat-reasoning.png");
  await page.reload();
  await waitRunning();
  assert.equal(await page.locator(".msg.assistant").last().locator("details.reasoning").count(), 1);
  step("a thinking model's reasoning shows collapsed, apart from its answer");

  // 11. A new port from the settings page: the page follows the engine there.
  const free = await new Promise((resolve) => {
    const srv = net.createServer().listen(0, "127.0.0.1", () => {
      const p = srv.address().port;
      srv.close(() => resolve(p));
    });
  });
  await page.goto(`${url}/#settings`);
  await page.waitForFunction(() => document.querySelector("#config-path").textContent.length > 0);
  await page.fill("input[name=port]", String(free));
  await page.click("#save-settings");
  await page.waitForURL(`http://127.0.0.1:${free}/#settings`, { timeout: 30000 });
  await waitRunning();
  assert.equal((await health()).status, "ok");
  await shot(page, "settings-new-port.png");
  step(`moved to port ${free}; the page followed`);

  assert.deepEqual(errors, [], "no script errors");
  console.log("[ui] all browser checks passed");
} catch (e) {
  await shot(page, "failure.png").catch(() => {});
  console.error(e);
  process.exitCode = 1;
} finally {
  await browser.close();
}
