// Model output as HTML, safely: markdown-it parses it with raw HTML off (tags stay text),
// highlight.js colours code, KaTeX sets math, and DOMPurify removes whatever markup could
// still run or load (it is the second lock; the engine's CSP is the third). Images are not
// rendered: a model's image link could only track the user.
import MarkdownIt from "markdown-it";
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import java from "highlight.js/lib/languages/java";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdownLang from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import swift from "highlight.js/lib/languages/swift";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";

const languages = { bash, c, cpp, css, diff, go, java, javascript, json, markdown: markdownLang, python, rust, sql, swift, typescript, xml, yaml };
for (const [name, lang] of Object.entries(languages)) hljs.registerLanguage(name, lang);

// Past this size an answer is shown as plain text: parsing it again on every token would
// freeze the page (1 MB of nested lists), and nobody reads it as formatted text anyway.
export const PLAIN_ABOVE = 200_000;

const md = new MarkdownIt({
  html: false,
  linkify: true,
  maxNesting: 40,
  highlight(code, lang) {
    const name = (lang || "").trim().toLowerCase();
    if (name && hljs.getLanguage(name) && code.length < 100_000) {
      try {
        return hljs.highlight(code, { language: name, ignoreIllegals: true }).value;
      } catch {}
    }
    return ""; // markdown-it escapes it
  },
});
md.disable("image");

// Math (math.js: KaTeX, two thirds of the bundle) loads the first time an answer looks
// like it holds some; the answers on screen are then rendered again (the `math-ready` event).
const MATHY = /\$|\\\(|\\\[/;
let math = "off"; // "off" | "loading" | "on"
function wantMath(text) {
  if (math !== "off" || !MATHY.test(text)) return;
  math = "loading";
  import("./math.js").then(
    ({ useMath }) => {
      useMath(md);
      math = "on";
      document.dispatchEvent(new Event("math-ready"));
    },
    () => (math = "off"),
  );
}

// Links open outside the page, and only http(s) and mailto are links at all.
const SAFE_URL = /^(?:https?:|mailto:)/i;
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!SAFE_URL.test(href)) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// The MathML KaTeX writes (presentation elements and the TeX source as an annotation).
const MATHML_TAGS = ["math", "semantics", "annotation", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msup", "msub", "msubsup", "mfrac", "msqrt", "mroot", "munder", "mover", "munderover", "mtable", "mtr", "mtd", "mlabeledtr", "mstyle", "mpadded", "mphantom", "menclose"];
const MATHML_ATTR = ["encoding", "mathvariant", "mathcolor", "displaystyle", "scriptlevel", "stretchy", "fence", "separator", "lspace", "rspace", "minsize", "maxsize", "accent", "accentunder", "columnalign", "columnlines", "rowlines", "rowspacing", "columnspacing", "width", "height", "depth", "voffset", "linethickness", "display", "movablelimits", "largeop", "symmetric", "notation", "side"];

const PURIFY = {
  ALLOWED_TAGS: ["a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "li", "ol", "p", "pre", "s", "span", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul", "section", "eq", "eqn", ...MATHML_TAGS],
  ALLOWED_ATTR: ["href", "class", "start", "align", "title", ...MATHML_ATTR],
  ALLOW_DATA_ATTR: false,
};

export function renderMarkdown(text) {
  wantMath(text);
  return DOMPurify.sanitize(md.render(String(text)), PURIFY);
}

// Fill `node` with `text` rendered, and give each code block a copy button.
export function renderInto(node, text) {
  if (text.length > PLAIN_ABOVE) {
    node.replaceChildren();
    const pre = document.createElement("pre");
    pre.className = "plain";
    pre.textContent = text;
    node.append(pre);
    return;
  }
  node.innerHTML = renderMarkdown(text);
  for (const pre of node.querySelectorAll("pre")) {
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy-code";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", "Copy this code");
    copy.addEventListener("click", () => copyText(pre.querySelector("code")?.textContent ?? pre.textContent, copy));
    pre.prepend(copy);
  }
}

// While an answer streams: the text up to its last blank line outside a code fence is
// rendered once, block by block, as it completes; only the unfinished tail is rendered
// again each frame. A frame's cost stays that of one paragraph however long the answer
// grows. The answer is rendered whole (renderInto) once it ends, so a list or a reference
// that spans blank lines comes out exactly.
export function renderStreaming(node, text) {
  if (text.length > PLAIN_ABOVE) return renderInto(node, text);
  let tail = node.querySelector(":scope > .md-tail");
  const done = Number(node.dataset.rendered || 0);
  if (!tail || !text.startsWith(node.dataset.prefix || "") || done > text.length) {
    node.replaceChildren();
    node.dataset.rendered = "0";
    node.dataset.prefix = "";
    tail = document.createElement("div");
    tail.className = "md-tail";
    node.append(tail);
  }
  const cut = stableCut(text, Number(node.dataset.rendered));
  if (cut > Number(node.dataset.rendered)) {
    const block = document.createElement("div");
    block.className = "md-block";
    renderInto(block, text.slice(Number(node.dataset.rendered), cut));
    tail.before(block);
    node.dataset.rendered = String(cut);
    node.dataset.prefix = text.slice(0, Math.min(cut, 64));
  }
  renderInto(tail, text.slice(cut));
}

// The end of the last blank line at or after `from` that is outside a code fence.
function stableCut(text, from) {
  let fence = false;
  let cut = from;
  let pos = 0;
  for (const line of text.split("\n")) {
    const end = pos + line.length + 1;
    if (/^\s*(```|~~~)/.test(line)) fence = !fence;
    else if (!fence && line.trim() === "" && end <= text.length && pos >= from) cut = end;
    pos = end;
  }
  return cut;
}

export async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard permission (an http page in some browsers): the old way.
    const area = document.createElement("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  if (button) {
    const was = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = was), 1200);
  }
}
