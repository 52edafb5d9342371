// Math in answers: $…$ (set off by spaces), $$…$$, \(…\) and \[…\] (models write both), set by KaTeX as MathML
// only, which the browser lays out itself: no KaTeX fonts or stylesheet and no inline styles
// (the CSP refuses them). `trust: false` leaves \href, \url and \html* unrendered; maxExpand
// bounds macro expansion (a model can write a macro bomb). A formula that does not parse
// shows as its source, in code, with KaTeX's reason as its title: KaTeX's own error markup
// carries an inline style. Loaded on first need by markdown.js.
import texmath from "markdown-it-texmath";
import katex from "katex";

// `$` as an entity too: texmath puts our HTML in with String.replace, which reads `$&`
// and `$'` in it as patterns.
const escape = (s) => s.replace(/[&<>"'$]/g, (c) => `&#${c.charCodeAt(0)};`);

const engine = {
  renderToString(tex, options) {
    try {
      return katex.renderToString(tex, { ...options, throwOnError: true }).replaceAll("$", "&#36;");
    } catch (e) {
      return `<code class="math-error" title="${escape(String(e.message || e))}">${escape(tex)}</code>`;
    }
  },
};

// Models also write display math inside a paragraph ("so \[ x^2 \] holds"); texmath reads
// `\[…\]` only as a block of its own lines, so this rule reads it inline, set as display.
texmath.rules.brackets.inline.push({
  name: "math_inline_display",
  rex: /\\\[(.+?)\\\]/gy,
  tmpl: "<eqn>$1</eqn>",
  tag: "\\[",
  displayMode: true,
});

export function useMath(md) {
  md.use(texmath, {
    engine,
    delimiters: ["dollars", "brackets"],
    // `$` opens math only after a space and closes before a space or punctuation, so
    // "$5 and $10" stays prices.
    outerSpace: true,
    katexOptions: { output: "mathml", trust: false, strict: "ignore", maxSize: 50, maxExpand: 500 },
  });
}
