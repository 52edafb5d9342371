// Perch's UI in a real browser: Debian's chromium, headless, driven by playwright-core,
// against an engine serving the UI with a fixture model (engine/tests/ui_browser.rs starts
// it). Usage: node browser.mjs URL CONFIG_FILE ARTIFACT_DIR
import { launch } from "./chromium.mjs";
import fs from "node:fs";
import path from "node:path";
import assert from "node:assert/strict";
import net from "node:net";

const [url, configFile, artifacts] = process.argv.slice(2);
fs.mkdirSync(artifacts, { recursive: true });
fs.rmSync(path.join(artifacts, "failure.png"), { force: true }); // from an earlier run
const shot = (page, name) => page.screenshot({ path: path.join(artifacts, name), fullPage: true });
const step = (s) => console.log(`[ui] ${s}`);

const browser = await launch();
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

  // 0. Answers render as markdown (markdown-it, highlight.js, DOMPurify), safely: code keeps
  // its text, HTML stays text, only http(s) links are links (tests/ui/hostile.mjs has the rest).
  const md = await page.evaluate(() => {
    const div = document.createElement("div");
    div.innerHTML = renderMarkdown("# Title\n```js\nlet a = '<b>x</b>';\n```\n**bold** and `code <i>` and [ok](https://example.com) [bad](javascript:alert(1))\n- one\n- two");
    const code = div.querySelector("pre code");
    return {
      h1: div.querySelector("h1")?.textContent,
      code: code?.textContent,
      highlighted: code?.querySelectorAll("span[class^=hljs]").length,
      strong: div.querySelector("strong")?.textContent,
      inline: [...div.querySelectorAll("p code")].map((c) => c.textContent),
      links: [...div.querySelectorAll("a")].map((a) => [a.getAttribute("href"), a.target, a.rel]),
      items: [...div.querySelectorAll("ul li")].map((l) => l.textContent),
      tags: [...div.querySelectorAll("b, i, script")].length,
    };
  });
  assert.equal(md.h1, "Title");
  assert.equal(md.code, "let a = '<b>x</b>';\n");
  assert.ok(md.highlighted > 0, "code is highlighted");
  assert.equal(md.strong, "bold");
  assert.deepEqual(md.inline, ["code <i>"]);
  assert.deepEqual(md.links, [["https://example.com", "_blank", "noopener noreferrer"]], "a javascript: link is no link");
  assert.deepEqual(md.items, ["one", "two"]);
  assert.equal(md.tags, 0, "markup in the text stays text");
  step("markdown renders headings, highlighted code, emphasis, links and lists, and keeps HTML as text");

  // Math: the first text that holds some loads KaTeX (its own chunk), then it is set as
  // MathML from $…$, $$…$$, \(…\) and \[…\]; a price stays a price, code stays code.
  const math = await page.evaluate(async () => {
    const text = "Prices $5 and $10.\n\nInline $\\frac{a}{b}$ and \\(x^2\\).\n\n$$\\sum_{i=1}^n i$$\n\n\\[\\sqrt{2}\\]\n\nMid-line \\[ y^3 \\] too.\n\n`$x$`";
    const div = document.createElement("div");
    for (let i = 0; i < 200 && !div.querySelector("math"); i++) {
      div.innerHTML = renderMarkdown(text);
      await new Promise((r) => setTimeout(r, 50));
    }
    return {
      formulas: [...div.querySelectorAll("span.katex > math")].map((m) => m.querySelector("annotation")?.textContent.trim()),
      fraction: div.querySelectorAll("mfrac").length,
      blocks: div.querySelectorAll("eqn").length,
      prices: div.textContent.includes("Prices $5 and $10."),
      code: div.querySelector("code")?.textContent,
    };
  });
  assert.deepEqual(math.formulas, ["\\frac{a}{b}", "x^2", "\\sum_{i=1}^n i", "\\sqrt{2}", "y^3"]);
  assert.equal(math.fraction, 1);
  assert.equal(math.blocks, 3, "display math is a block, inside a paragraph too");
  assert.ok(math.prices, "dollar amounts stay text");
  assert.equal(math.code, "$x$", "math in code stays code");
  step("math renders as MathML (KaTeX, loaded on first need); prices and code stay text");

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
  await item.locator("button.open").click();
  await page.waitForFunction(() => document.querySelector(".msg.user .body")?.textContent === "Hello there");
  assert.equal(await page.locator(".msg.assistant").count(), 2);
  step("the conversation survived a reload");

  // 4b. The engine keeps the chats: a page with no storage of its own (a cleared webview, a
  // second browser) lists the same ones.
  const fresh = await browser.newContext();
  const other = await fresh.newPage();
  await other.goto(`${url}/#chat`);
  await other.locator("#conversations li", { hasText: "Hello there" }).waitFor({ timeout: 30000 });
  await fresh.close();
  step("a page with empty storage lists the same chats");

  // 4c. Regenerate: a second answer, with the first kept as a version to flip back to.
  const lastStats = () => page.locator(".msg.assistant").last().locator(".stats");
  await page.click("#new-chat");
  await page.fill("#prompt", "Branch me");
  await page.press("#prompt", "Enter");
  await lastStats().waitFor({ timeout: 60000 });
  const first = await page.locator(".msg.assistant .body").last().textContent();
  await page.locator(".msg.assistant").last().hover();
  await page.locator(".msg.assistant .regenerate").last().click();
  await page.waitForFunction(() => document.querySelector(".msg.assistant .branches .which")?.textContent === "2/2" && document.querySelector(".msg.assistant .stats"), null, { timeout: 60000 });
  assert.match(await lastStats().textContent(), /first token [\d.]+ s/, "the answer's figures include the time to the first token");
  await page.locator(".msg.assistant .branches .prev").click();
  assert.equal(await page.locator(".msg.assistant .branches .which").textContent(), "1/2");
  assert.equal(await page.locator(".msg.assistant .body").last().textContent(), first);
  step("regenerated an answer; both versions are kept and can be flipped");

  // 4d. Edit and resend: the edited question is a new version with its own answer.
  await page.locator(".msg.user").last().hover();
  await page.locator(".msg.user .edit").last().click();
  await page.fill(".msg.user .edit-text", "Branch me again");
  await page.click(".msg.user .resend");
  await page.waitForFunction(() => document.querySelector(".msg.user .branches .which")?.textContent === "2/2" && document.querySelector(".msg.assistant .stats"), null, { timeout: 60000 });
  assert.equal(await page.locator(".msg.user .body").last().textContent(), "Branch me again");
  await page.locator(".msg.user .branches .prev").click();
  assert.equal(await page.locator(".msg.user .body").last().textContent(), "Branch me");
  assert.equal(await page.locator(".msg.assistant .branches .which").textContent(), "2/2", "the old question keeps its versions (its newest shown)");
  const stored = await page.evaluate(async () => {
    const list = await (await fetch("/perch/conversations?q=Branch")).json();
    return (await fetch(`/perch/conversations/${list.data[0].id}`)).json();
  });
  assert.equal(stored.messages.length, 5, "two questions, three answers, all on disk");
  step("edited and resent a question; the earlier one stays a version with its answers");

  // 4e. Copy a message.
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: url });
  await page.locator(".msg.user").last().hover();
  await page.locator(".msg.user .copy").last().click();
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "Branch me");
  step("copied a message");

  // 4f. Attachments: a text file goes with the message; an image is refused in words.
  await page.click("#new-chat");
  await page.setInputFiles("#attach-file", { name: "cat.png", mimeType: "image/png", buffer: Buffer.from([0x89, 0x50, 0x4e, 0x47]) });
  await page.waitForFunction(() => /cannot see images/.test(document.querySelector("#chat-notice").textContent));
  await page.setInputFiles("#attach-file", { name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("A heron.") });
  await page.locator("#attachments .chip", { hasText: "notes.txt" }).waitFor();
  await page.fill("#prompt", "Read my notes");
  await page.press("#prompt", "Enter");
  await lastStats().waitFor({ timeout: 60000 });
  assert.equal(await page.locator(".msg.user .chip").textContent(), "notes.txt");
  assert.match(await page.locator("#context-meter").textContent(), /^Context [\d,]+ of [\d,]+ tokens/);
  await shot(page, "chat-attachment.png");
  step(`attached a text file (an image was refused); meter: ${await page.locator("#context-meter").textContent()}`);

  // 4g. Rename, search, export, import, delete.
  const chatItem = (text) => page.locator("#conversations li", { hasText: text });
  page.once("dialog", (d) => d.accept("Heron notes"));
  await chatItem("Read my notes").hover();
  await chatItem("Read my notes").locator(".rename").click();
  await chatItem("Heron notes").waitFor();
  await page.fill("#search", "heron.");
  await page.waitForFunction(() => document.querySelectorAll("#conversations li").length === 1);
  assert.match(await page.locator("#conversations li .snippet").textContent(), /heron/i);
  await page.fill("#search", "");
  await page.waitForFunction(() => document.querySelectorAll("#conversations li").length > 1);
  await chatItem("Heron notes").hover();
  const [download] = await Promise.all([page.waitForEvent("download"), chatItem("Heron notes").locator(".export").click()]);
  const exported = fs.readFileSync(await download.path(), "utf8");
  assert.ok(exported.startsWith("# Heron notes\n\n## User\n\nRead my notes"), exported.slice(0, 120));
  await page.setInputFiles("#import-file", { name: "old.md", mimeType: "text/markdown", buffer: Buffer.from("# Imported one\n\n## User\n\nhi\n\n## Assistant\n\nhello") });
  await chatItem("Imported one").waitFor();
  page.once("dialog", (d) => d.accept());
  await chatItem("Imported one").hover();
  await chatItem("Imported one").locator(".delete").click();
  await chatItem("Imported one").waitFor({ state: "detached" });
  step("renamed, searched, exported as Markdown, imported and deleted chats");

  // 4g'. Presets: a chat's system prompt, sampling and tools saved under a name, kept by the
  // engine (another page offers it), applied to a new chat and sent with it, then deleted.
  await page.click("#new-chat");
  await page.locator("#system").evaluate((t) => (t.closest("details").open = true));
  await page.fill("#system", "Answer like a heron.");
  await page.fill("#temperature", "0.3");
  await page.fill("#max-tokens", "5");
  await page.locator("#max-tokens").dispatchEvent("change");
  page.once("dialog", (d) => d.accept("Heron"));
  await page.click("#save-preset");
  await page.waitForFunction(() => document.querySelector("#preset").value === "Heron");
  const elsewhere = await (await browser.newContext()).newPage();
  await elsewhere.goto(`${url}/#chat`);
  await elsewhere.waitForFunction(() => [...document.querySelectorAll("#preset option")].some((o) => o.value === "Heron"), null, { timeout: 30000 });
  await elsewhere.context().close();
  await page.click("#new-chat");
  assert.equal(await page.inputValue("#system"), "", "a new chat starts without the preset");
  await page.selectOption("#preset", "Heron");
  assert.deepEqual(
    [await page.inputValue("#system"), await page.inputValue("#temperature"), await page.inputValue("#max-tokens")],
    ["Answer like a heron.", "0.3", "5"],
  );
  await page.fill("#prompt", "Who are you?");
  await page.press("#prompt", "Enter");
  await lastStats().waitFor({ timeout: 60000 });
  const withPreset = await page.evaluate(async () => {
    const list = await (await fetch("/perch/conversations?q=Who%20are%20you")).json();
    return (await fetch(`/perch/conversations/${list.data[0].id}`)).json();
  });
  assert.deepEqual([withPreset.settings.system, withPreset.settings.temperature, withPreset.settings.max_tokens], ["Answer like a heron.", 0.3, 5]);
  assert.ok(withPreset.messages.at(-1).stats.completion_tokens <= 5, "the preset's token limit went with the request");
  await page.selectOption("#preset", "Heron");
  await page.click("#delete-preset");
  await page.waitForFunction(() => ![...document.querySelectorAll("#preset option")].some((o) => o.value === "Heron"));
  step("saved a preset, saw it from another page, applied it to a new chat (sent with it), deleted it");

  // 4h. Chats an older Perch kept in the page's storage move into the engine once.
  await page.evaluate(() => localStorage.setItem("perch.conversations", JSON.stringify([{ id: "c1", title: "From before", messages: [{ role: "user", content: "old question" }, { role: "assistant", content: "old answer" }] }])));
  await page.reload();
  await chatItem("From before").waitFor({ timeout: 30000 });
  assert.equal(await page.evaluate(() => localStorage.getItem("perch.conversations")), null);
  step("moved a chat from the page's storage into the engine");

  // 4h2. MCP tools (server-filesystem): the model is made to call one (the fixture writes
  // random words, so "must call one" forces the call); the user is asked first; allowed, the
  // result goes back to the model, which answers. "Always allow" is written to the file.
  await page.click("#new-chat");
  await page.selectOption("#model", "tooler");
  await page.selectOption("#tools", "required");
  // Greedy, so the forced call's random arguments are the same on every run.
  await page.fill("#temperature", "0");
  await page.fill("#max-tokens", "300");
  await page.fill("#prompt", "Which folders may you read?");
  await page.press("#prompt", "Enter");
  const permission = page.locator(".permission");
  await permission.waitFor({ timeout: 60000 });
  assert.equal(await permission.locator(".tool-name").textContent(), "Allow files → list_allowed_directories?");
  await shot(page, "chat-tool-permission.png");
  await permission.locator(".allow-once").click();
  await page.locator(".msg.tool").first().waitFor({ timeout: 30000 });
  // The model answers the result; should it call again, the user denies.
  for (let i = 0; ; i++) {
    assert.ok(i < 20, "the model never answered after the tool");
    const state = await page.evaluate(() => ({
      asking: !!document.querySelector(".permission"),
      done: !!document.querySelector(".msg.tool ~ .msg.assistant .stats") && document.querySelector("#stop").hidden,
    }));
    if (state.done) break;
    if (state.asking) await page.locator(".permission .deny").click();
    await page.waitForTimeout(500);
  }
  const toolResult = await page.locator(".msg.tool pre").first().textContent();
  assert.match(toolResult, /Allowed directories:\s*\S*shared/, toolResult);
  const withTool = await page.evaluate(async () => {
    const list = await (await fetch("/perch/conversations?q=folders")).json();
    return (await fetch(`/perch/conversations/${list.data[0].id}`)).json();
  });
  const roles = withTool.messages.map((m) => m.role);
  assert.deepEqual(roles.slice(0, 3), ["user", "assistant", "tool"], roles.join(","));
  assert.equal(withTool.messages[2].tool_call_id, withTool.messages[1].tool_calls[0].id);
  await shot(page, "chat-tool-result.png");
  step(`a forced MCP call was asked for, allowed, run; its result reached the model: ${toolResult.slice(0, 60)}`);
  await page.fill("#prompt", "Look again.");
  await page.press("#prompt", "Enter");
  await permission.waitFor({ timeout: 60000 });
  await permission.locator(".allow-always").click();
  await page.waitForFunction(() => document.querySelector("#stop").hidden && !document.querySelector(".permission"), null, { timeout: 60000 }).catch(() => {});
  const mcpState = await page.evaluate(() => fetch("/perch/mcp").then((r) => r.json()));
  assert.deepEqual(mcpState.servers[0].always_allow, ["list_allowed_directories"], JSON.stringify(mcpState.servers));
  step(`"always allow" was written to the MCP servers file: ${mcpState.servers[0].always_allow}`);
  await page.selectOption("#tools", "");
  await page.fill("#max-tokens", "");
  await page.fill("#temperature", "0.7");
  await page.selectOption("#model", "chat");

  // 4i. Light and dark, following the system, on an example chat stored for the screenshots
  // (the fixture models write random words).
  const example = {
    id: "example", title: "Example: reversing words",
    settings: { model: "chat", system: "", temperature: 0.7 },
    messages: [
      { id: "q", parent: null, role: "user", content: "How do I reverse the words of a sentence in Rust?" },
      { id: "a1", parent: "q", role: "assistant", content: "Split, reverse, join." },
      { id: "a2", parent: "q", role: "assistant", reasoning: "The user wants words, not characters: split on whitespace, then reverse the iterator.",
        content: "Split on whitespace, reverse the iterator, and join:\n\n```rust\nfn reverse_words(s: &str) -> String {\n    s.split_whitespace().rev().collect::<Vec<_>>().join(\" \")\n}\n```\n\n- `split_whitespace` skips runs of spaces\n- `rev` works because the iterator is double-ended\n\nIt runs in $O(n)$ time for $n$ bytes: \\[ T(n) = \\sum_{i=1}^{n} c_i \\]\n\nSee [the docs](https://doc.rust-lang.org/std/primitive.str.html#method.split_whitespace).",
        stats: { model: "chat", prompt_tokens: 31, cached_tokens: 0, completion_tokens: 87, ttft_ms: 140, tokens_per_s: 41.5, stopped: false } },
    ],
    current: "a2",
  };
  assert.equal(await page.evaluate(async (c) => (await fetch("/perch/conversations/example", { method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify(c) })).status, example), 200);
  await page.reload();
  await chatItem("Example: reversing words").locator("button.open").click();
  await page.locator(".msg.assistant pre code").waitFor();
  await page.locator(".msg.assistant math").first().waitFor();
  await page.emulateMedia({ colorScheme: "light" });
  await shot(page, "chat-light.png");
  await page.emulateMedia({ colorScheme: "dark" });
  const dark = await page.evaluate(() => getComputedStyle(document.body).colorScheme + " " + getComputedStyle(document.body).color);
  await shot(page, "chat-dark.png");
  await page.emulateMedia({ colorScheme: null });
  step(`light and dark screenshots (dark text: ${dark})`);

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
  await page.goto(`http://127.0.0.1:${free}/#chat`);
  await page.locator("#conversations li", { hasText: "Hello there" }).waitFor({ timeout: 30000 });
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
