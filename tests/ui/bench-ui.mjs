// The chat page's costs (run by scripts/bench-ui, not a test): see that script's header.
// Usage: node bench-ui.mjs URL DIST_DIR
import { launch } from "./chromium.mjs";
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";

const [url, dist] = process.argv.slice(2);
const out = (o) => console.log(JSON.stringify(o));
const put = (c) => fetch(`${url}/perch/conversations/${c.id}`, { method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify(c) }).then((r) => r.ok || Promise.reject(r.status));
const answer = (i) =>
  `## Answer ${i}\n\nHere is **some** text with \`code\` and a [link](https://example.com).\n\n` +
  "```rust\nfn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{v:?}\");\n}\n```\n\n" +
  Array.from({ length: 12 }, (_, k) => `- point ${k}: ${"lorem ipsum dolor sit amet ".repeat(3)}`).join("\n") +
  "\n\n| a | b |\n|---|---|\n| 1 | 2 |\n";
const chat = (id, n) => ({
  id,
  title: `Chat ${id}`,
  messages: Array.from({ length: n }, (_, i) => [
    { id: `q${i}`, parent: i ? `a${i - 1}` : null, role: "user", content: `Question ${i}?` },
    { id: `a${i}`, parent: `q${i}`, role: "assistant", content: answer(i) },
  ]).flat(),
  current: `a${n - 1}`,
});

// Bundle size.
let raw = 0;
let gz = 0;
const walk = (d) => fs.readdirSync(d, { withFileTypes: true }).forEach((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : ((raw += fs.statSync(path.join(d, e.name)).size), (gz += zlib.gzipSync(fs.readFileSync(path.join(d, e.name))).length))));
walk(dist);
out({ figure: "bundle", bytes: raw, gzip_bytes: gz });

for (let i = 0; i < 200; i++) await put(chat(`c${String(i).padStart(3, "0")}`, 10));
await put(chat("long50", 50));

const browser = await launch(["--enable-precise-memory-info"]);
const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
const page = await context.newPage();

// First paint and interactive with 200 conversations (+1) stored.
// A fresh page each round: a second goto to the same URL would only change the hash.
for (let round = 0; round < 3; round++) {
  const p = await context.newPage();
  const t0 = Date.now();
  await p.goto(`${url}/#chat`);
  await p.waitForFunction(() => document.querySelectorAll("#conversations li").length >= 201, null, { timeout: 60000 });
  const listed = Date.now() - t0;
  const fcp = await p.evaluate(() => performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? null);
  out({ figure: "load_200_conversations", round, first_contentful_paint_ms: fcp && Math.round(fcp), list_shown_ms: listed });
  await p.close();
}
await page.goto(`${url}/#chat`);
await page.waitForFunction(() => document.querySelectorAll("#conversations li").length >= 201, null, { timeout: 60000 });

// Memory with 50 long answers shown.
const cdp = await context.newCDPSession(page);
await cdp.send("Performance.enable");
const metrics = async () => Object.fromEntries((await cdp.send("Performance.getMetrics")).metrics.map((m) => [m.name, m.value]));
await cdp.send("HeapProfiler.collectGarbage");
const before = await metrics();
const t0 = Date.now();
await page.locator("#conversations li", { hasText: "Chat long50" }).locator("button.open").click();
await page.locator(".msg.assistant").nth(49).waitFor();
const openMs = Date.now() - t0;
await cdp.send("HeapProfiler.collectGarbage");
const after = await metrics();
out({ figure: "fifty_long_answers", open_ms: openMs, js_heap_mb: +(after.JSHeapUsedSize / 1e6).toFixed(1), js_heap_before_mb: +(before.JSHeapUsedSize / 1e6).toFixed(1), dom_nodes: after.Nodes });

// A 2000-token answer at 100 tok/s through the page's own streaming and rendering: the
// engine's answer is replaced in the page by a timed stream of the same SSE shape.
await page.click("#new-chat");
const result = await page.evaluate(async () => {
  const text = Array.from({ length: 100 }, (_, i) => `Paragraph ${i} with **bold** and \`code\`.\n\n\`\`\`python\ndef f${i}(x):\n    return x * ${i}\n\`\`\`\n\n- a\n- b\n\n`).join("");
  const tokens = text.match(/.{1,4}/gs).slice(0, 2000);
  const real = window.fetch;
  window.fetch = (input, init) => {
    if (String(input).endsWith("/v1/chat/completions")) {
      const enc = new TextEncoder();
      const stream = new ReadableStream({
        async start(ctrl) {
          const t = performance.now();
          for (let i = 0; i < tokens.length; i++) {
            const wait = t + i * 10 - performance.now();
            if (wait > 0) await new Promise((r) => setTimeout(r, wait));
            ctrl.enqueue(enc.encode(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: tokens[i] } }] })}\n\n`));
          }
          ctrl.enqueue(enc.encode(`data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 10, completion_tokens: tokens.length } })}\n\ndata: [DONE]\n\n`));
          ctrl.close();
        },
      });
      return Promise.resolve(new Response(stream, { status: 200, headers: { "Content-Type": "text/event-stream" } }));
    }
    return real(input, init);
  };
  // Frames: gaps between animation frames over 20 ms; long tasks over 50 ms.
  const gaps = [];
  let last = performance.now();
  let run = true;
  const tick = (now) => {
    gaps.push(now - last);
    last = now;
    if (run) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
  const longTasks = [];
  new PerformanceObserver((l) => l.getEntries().forEach((e) => longTasks.push(e.duration))).observe({ type: "longtask", buffered: false });
  // Time spent rendering: the markdown renderer's calls, timed around the page's own function.
  const render = window.renderMarkdown;
  const start = performance.now();
  document.querySelector("#prompt").value = "stream please";
  document.querySelector("#composer").requestSubmit();
  await new Promise((r) => {
    const check = () => (document.querySelector(".msg.assistant .stats") ? r() : setTimeout(check, 50));
    check();
  });
  run = false;
  window.fetch = real;
  const body = document.querySelector(".msg.assistant .body").textContent.length;
  return { seconds: (performance.now() - start) / 1000, tokens: tokens.length, frames: gaps.length, over_20ms: gaps.filter((g) => g > 20).length, worst_gap_ms: Math.max(...gaps), long_tasks: longTasks.length, body_chars: body, render_fn: typeof render };
});
out({ figure: "stream_2000_tokens_at_100_per_s", ...result });

// Renderer cost per token: re-rendering the growing answer, as the page does once per frame.
const cost = await page.evaluate(() => {
  const text = Array.from({ length: 40 }, (_, i) => `Paragraph ${i} with **bold** and \`code\`.\n\n\`\`\`python\ndef f${i}(x):\n    return x * ${i}\n\`\`\`\n\n- a\n- b\n\n`).join("");
  const div = document.createElement("div");
  const sizes = [500, 2000, 8000];
  return sizes.map((n) => {
    const t = performance.now();
    for (let k = 0; k < 20; k++) div.innerHTML = window.renderMarkdown(text.slice(0, n));
    return { chars: n, ms_per_render: +((performance.now() - t) / 20).toFixed(2) };
  });
});
out({ figure: "render_cost", renders: cost });
await browser.close();
