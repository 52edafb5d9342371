// Hostile model output stays text: a corpus of answers (markup that runs script, script
// links, HTML inside code, mXSS shapes, a huge table, 1 MB of nested lists, broken text) is
// stored as a conversation through the engine's API and opened in the chat, the path every
// answer takes. Fails if any script runs, any dialog opens, anything is loaded from
// elsewhere, or the page stops answering. Usage: node hostile.mjs URL ARTIFACT_DIR
import { launch } from "./chromium.mjs";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "node:fs";

const [url, artifacts] = process.argv.slice(2);
fs.mkdirSync(artifacts, { recursive: true });
const step = (s) => console.log(`[hostile] ${s}`);

const nested = (() => {
  // 1 MB of lists nested up to 60 deep.
  const lines = [];
  let size = 0;
  for (let i = 0; size < 1 << 20; i++) {
    const l = `${"  ".repeat(i % 60)}- item ${i} <img src=x onerror="window.__pwned='nested'">`;
    lines.push(l);
    size += l.length + 1;
  }
  return lines.join("\n");
})();
const table = ["| " + Array.from({ length: 12 }, (_, i) => `c${i}`).join(" | ") + " |", "|" + " --- |".repeat(12)]
  .concat(Array.from({ length: 1000 }, (_, r) => "| " + Array.from({ length: 12 }, (_, c) => `<b>${r}.${c}</b>`).join(" | ") + " |"))
  .join("\n");
const corpus = [
  `<img src=x onerror="window.__pwned='img'">`,
  `<script>window.__pwned='script'</script>`,
  `<svg onload="window.__pwned='svg'"></svg><iframe src="javascript:window.__pwned='iframe'"></iframe>`,
  `[click](javascript:window.__pwned='link') [data](data:text/html,<script>window.__pwned='data'</script>) [vb](vbscript:x) <javascript:window.__pwned='auto'>`,
  `<a href="javascript:window.__pwned='a'">a</a> [ok](https://example.com)`,
  "```html\n<script>window.__pwned='code'</script>\n<img src=x onerror=\"window.__pwned='code-img'\">\n```",
  "`<img src=x onerror=\"window.__pwned='inline'\">`",
  `<math><mtext><table><mglyph><style><img src=x onerror="window.__pwned='mxss'">`,
  `<form><button formaction="javascript:window.__pwned='form'">x</button></form><style>body{display:none}</style>`,
  `![track](https://evil.example/pixel.png) ![inline](data:image/svg+xml,<svg onload="window.__pwned='svgdata'">)`,
  `<details open ontoggle="window.__pwned='toggle'">x</details><video><source onerror="window.__pwned='video'"></video>`,
  "broken text: \uFFFD\uFFFD \u202Eevil\u202C \u0000 nul, emoji 🦜 and lone halves replaced: \uFFFD",
  // Math goes through KaTeX: links and HTML commands stay text, a macro bomb, a formula
  // nested 3000 deep and 20,000 dollar signs end as text, not as a hung page.
  String.raw`$\href{javascript:window.__pwned='href'}{x}$ \(\url{javascript:window.__pwned='url'}\) $$\htmlClass{x}{y}\htmlData{a=b}{z}\htmlStyle{color:red}{w}\includegraphics{https://evil.example/m.png}$$ and $\frac{a}{b}$`,
  String.raw`$$\def\a{\b\b}\def\b{\c\c}\def\c{\d\d}\def\d{\e\e}\def\e{\f\f}\def\f{xxxxxxxxxx}\a\a\a\a\a\a\a\a$$`,
  "$" + "\\frac{1}{".repeat(3000) + "x" + "}".repeat(3000) + "$ and \\[" + "{".repeat(3000) + "\\]",
  "$a ".repeat(20000) + "\n\n$$ never closed " + "x ".repeat(20000),
  table,
  nested,
];

const browser = await launch();
const page = await (await browser.newContext({ viewport: { width: 1100, height: 760 } })).newPage();
const errors = [];
const dialogs = [];
const outside = [];
page.on("pageerror", (e) => errors.push(String(e)));
page.on("dialog", (d) => {
  dialogs.push(d.message());
  d.dismiss();
});
page.on("request", (r) => {
  if (!r.url().startsWith(url) && !r.url().startsWith("data:") && !r.url().startsWith("blob:")) outside.push(r.url());
});
try {
  await page.goto(`${url}/#chat`);
  await page.evaluate(() => {
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
  });
  const conversation = {
    id: "hostile",
    title: "Hostile corpus",
    messages: corpus.flatMap((text, i) => [
      { id: `q${i}`, parent: i ? `a${i - 1}` : null, role: "user", content: `case ${i}: ${text.slice(0, 200)}` },
      { id: `a${i}`, parent: `q${i}`, role: "assistant", content: text },
    ]),
    current: `a${corpus.length - 1}`,
  };
  const saved = await page.evaluate(async (c) => {
    const r = await fetch("/perch/conversations/hostile", { method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify(c) });
    return [r.status, await r.text()];
  }, conversation);
  assert.equal(saved[0], 200, saved[1].slice(0, 300));
  step(`stored ${corpus.length} hostile answers (${(JSON.stringify(conversation).length / 1e6).toFixed(1)} MB)`);

  const t0 = Date.now();
  await page.locator("#conversations li", { hasText: "Hostile corpus" }).locator("button.open").click({ timeout: 30000 });
  await page.locator(".msg.assistant").nth(corpus.length - 1).waitFor({ timeout: 60000 });
  const openMs = Date.now() - t0;
  // The page still answers: a click on the search field and typing work at once.
  await page.fill("#search", "responsive?", { timeout: 5000 });
  await page.fill("#search", "", { timeout: 5000 });
  await page.waitForTimeout(500); // any onerror/onload would have fired by now
  const found = await page.evaluate((n) => {
    const box = document.querySelector("#messages");
    return {
      pwned: window.__pwned ?? null,
      tags: [...box.querySelectorAll("script, img, svg, iframe, style, form, video, source, details:not(.reasoning), object, embed, mglyph, maction, annotation-xml, :not(span.katex) > math")].map((e) => e.tagName),
      formulas: box.querySelectorAll("span.katex > math").length,
      handlers: [...box.querySelectorAll("*")].flatMap((e) => [...e.attributes].filter((a) => a.name.startsWith("on") || a.name === "style").map((a) => `${e.tagName}@${a.name}`)),
      links: [...box.querySelectorAll("a[href]")].map((a) => a.getAttribute("href")),
      violations: window.__violations,
      codeText: box.querySelectorAll(".msg.assistant")[5].querySelector("code").textContent,
      plain: box.querySelectorAll(".msg.assistant")[n - 1].querySelector("pre.plain") !== null,
      rows: box.querySelectorAll(".msg.assistant")[n - 2].querySelectorAll("tr").length,
    };
  }, corpus.length);
  await page.screenshot({ path: path.join(artifacts, "hostile.png") });
  assert.equal(found.pwned, null, "a script ran");
  assert.deepEqual(dialogs, [], "a dialog opened");
  assert.deepEqual(found.tags, [], "active or loading elements were rendered");
  assert.deepEqual(found.handlers, [], "event handlers or styles were rendered");
  // An image is never loaded: it shows as a link the user may follow (http(s) only).
  assert.deepEqual(found.links, ["https://example.com", "https://evil.example/pixel.png"], "only http(s) links are links");
  assert.deepEqual(found.violations, [], "something tried to load or run (CSP)");
  assert.deepEqual(outside, [], "requests left the engine's origin");
  assert.ok(found.codeText.includes("<script>window.__pwned='code'</script>"), "HTML in a code block shows as text");
  assert.ok(found.plain, "1 MB of nested lists is shown as plain text");
  assert.equal(found.rows, 1001, "the huge table (1000 rows, 12 columns) renders whole");
  assert.ok(found.formulas > 0, "math is set (as KaTeX's MathML)");
  assert.deepEqual(errors, [], "no script errors");
  step(`opened in ${openMs} ms; nothing ran, nothing loaded, code stayed text, ${found.formulas} formulas set, the page answered`);
  console.log("[hostile] all checks passed");
} catch (e) {
  await page.screenshot({ path: path.join(artifacts, "hostile-failure.png") }).catch(() => {});
  console.error(e);
  process.exitCode = 1;
} finally {
  await browser.close();
}
