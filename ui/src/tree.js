// A conversation's messages form a tree: editing a question or regenerating an answer adds
// a sibling, and the chat shows one branch (`current` is its last message). Pure functions
// over the stored shape (engine/src/conversations/mod.rs).

export const newId = () => (crypto.randomUUID ? crypto.randomUUID() : `m${Date.now()}${Math.random().toString(16).slice(2)}`);

export function byId(c, id) {
  return c.messages.find((m) => m.id === id);
}

// The branch shown, first message first.
export function branch(c) {
  const out = [];
  let at = c.current ?? (c.messages.length ? c.messages[c.messages.length - 1].id : null);
  while (at && out.length <= c.messages.length) {
    const m = byId(c, at);
    if (!m) break;
    out.push(m);
    at = m.parent;
  }
  return out.reverse();
}

// Messages sharing `m`'s parent, in the order they were made.
export function siblings(c, m) {
  return c.messages.filter((x) => (x.parent ?? null) === (m.parent ?? null));
}

// The end of the newest branch below `m` (what flipping to `m` shows).
export function deepest(c, m) {
  let at = m;
  for (;;) {
    const kids = c.messages.filter((x) => x.parent === at.id);
    if (!kids.length) return at;
    at = kids[kids.length - 1];
  }
}

export function add(c, message) {
  const m = { id: newId(), created_ms: Date.now(), content: "", ...message };
  c.messages.push(m);
  c.current = m.id;
  return m;
}

// What the model is sent for the branch ending at `lastId`: the system prompt, then each
// message with its attachments' text, leaving out failed answers.
export function history(c, lastId) {
  const path = [];
  let at = lastId;
  while (at) {
    const m = byId(c, at);
    if (!m) break;
    path.push(m);
    at = m.parent;
  }
  path.reverse();
  const out = [];
  if ((c.settings.system || "").trim()) out.push({ role: "system", content: c.settings.system });
  // A call whose arguments were cut off (the answer hit its token limit) is left out with
  // its result: the engine would refuse the conversation for it on every later turn.
  const broken = new Set();
  for (const m of path) for (const t of m.tool_calls || []) if (!parsesAsObject(t.arguments)) broken.add(t.id);
  for (const m of path) {
    if (m.error) continue;
    if (m.role === "tool" && broken.has(m.tool_call_id)) continue;
    let content = m.content;
    for (const a of m.attachments || []) content += `\n\n<file name="${a.name.replace(/"/g, "'")}">\n${a.text}\n</file>`;
    const msg = { role: m.role, content };
    const calls = (m.tool_calls || []).filter((t) => !broken.has(t.id));
    if (calls.length) {
      msg.tool_calls = calls.map((t, i) => ({ id: t.id || `call_${i}`, type: "function", function: { name: t.name, arguments: t.arguments } }));
    }
    if (m.tool_call_id) msg.tool_call_id = m.tool_call_id;
    out.push(msg);
  }
  return out;
}

export function parsesAsObject(text) {
  try {
    const v = JSON.parse(text || "{}");
    return v !== null && typeof v === "object" && !Array.isArray(v);
  } catch {
    return false;
  }
}
