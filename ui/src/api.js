// Talking to the engine over HTTP: the API key (kept in this page's storage), errors in
// plain words, JSON calls. The same page runs in the app's window and in a browser.

export const prefs = {
  get(key, fallback) {
    try {
      const v = localStorage.getItem(`perch.${key}`);
      return v === null ? fallback : JSON.parse(v);
    } catch {
      return fallback;
    }
  },
  set(key, value) {
    try {
      localStorage.setItem(`perch.${key}`, JSON.stringify(value));
    } catch {
      // Storage full or off: preferences are a convenience, never data.
    }
  },
};

export class ApiError extends Error {
  constructor(message, status, code, param) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

export function headers(extra = {}) {
  const h = { ...extra };
  const key = prefs.get("apiKey", "");
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

export async function failure(resp) {
  let body = null;
  try {
    body = await resp.json();
  } catch (e) {
    // Stopped while the error was read: a stop, not an unexplained failure.
    if (e.name === "AbortError") throw e;
  }
  const e = body && body.error ? body.error : {};
  if (resp.status === 401) {
    const key = prompt("This Perch needs its API key (Settings → API key):");
    if (key !== null) prefs.set("apiKey", key.trim());
  }
  return new ApiError(e.message || `HTTP ${resp.status}`, resp.status, e.code, e.param);
}

export const unreachable = () => new ApiError("Cannot reach the Perch engine. Is it running?", 0, "unreachable");

export async function request(path, { method = "GET", body, signal } = {}) {
  let resp;
  try {
    resp = await fetch(path, {
      method,
      signal,
      headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw unreachable();
  }
  if (!resp.ok) throw await failure(resp);
  return resp;
}

export async function api(path, options) {
  return (await request(path, options)).json();
}

// An error as the user should read it: what happened and what to do.
export function explain(e) {
  switch (e.code) {
    case "engine_restarting":
    case "engine_starting":
      return `The engine is restarting or loading (${e.message}). Try again in a moment.`;
    case "context_length_exceeded":
      return `This conversation no longer fits the model's context. Start a new chat, edit an earlier message, or raise the context length in Settings. (${e.message})`;
    case "model_not_found":
      return `${e.message}. Pick an installed model.`;
    case "rate_limit_exceeded":
      return `Perch is busy with other requests and its queue is full. Try again in a moment. (${e.message})`;
    case "conflict":
      return "This chat was changed in another window; it has been reloaded.";
    default:
      return e.message;
  }
}

export const $ = (sel) => document.querySelector(sel);

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}
