// A small, safe Markdown renderer for model answers: everything is escaped first, then only
// our own tags are added (code blocks, inline code, emphasis, headings, lists, links).
"use strict";

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function inline(text) {
  // Inline code first, so emphasis inside it stays literal.
  const parts = text.split(/(`[^`\n]+`)/);
  return parts
    .map((p, i) => {
      if (i % 2 === 1) return `<code>${escapeHtml(p.slice(1, -1))}</code>`;
      let h = escapeHtml(p);
      h = h.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>");
      h = h.replace(/(^|[^*])\*([^*\n]+)\*/g, "$1<em>$2</em>");
      h = h.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
      return h;
    })
    .join("");
}

function renderMarkdown(src) {
  const out = [];
  const lines = src.replace(/\r\n/g, "\n").split("\n");
  let para = [];
  let list = null; // "ul" | "ol"
  const flushPara = () => {
    if (para.length) out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    para = [];
  };
  const closeList = () => {
    if (list) out.push(`</${list}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
    if (fence) {
      flushPara();
      closeList();
      const body = [];
      i++;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
      // An unclosed fence (still streaming) renders as code too.
      const lang = fence[1] ? ` data-lang="${escapeHtml(fence[1])}"` : "";
      out.push(`<pre${lang}><code>${escapeHtml(body.join("\n"))}</code></pre>`);
      continue;
    }
    const heading = line.match(/^(#{1,4})\s+(.*)$/);
    const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
    const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
    if (heading) {
      flushPara();
      closeList();
      const n = heading[1].length + 2;
      out.push(`<h${n}>${inline(heading[2])}</h${n}>`);
    } else if (bullet || numbered) {
      flushPara();
      const kind = bullet ? "ul" : "ol";
      if (list !== kind) {
        closeList();
        out.push(`<${kind}>`);
        list = kind;
      }
      out.push(`<li>${inline((bullet || numbered)[1])}</li>`);
    } else if (line.trim() === "") {
      flushPara();
      closeList();
    } else {
      closeList();
      para.push(line);
    }
  }
  flushPara();
  closeList();
  return out.join("");
}

window.renderMarkdown = renderMarkdown;
window.escapeHtml = escapeHtml;
