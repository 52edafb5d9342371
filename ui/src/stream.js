// One streamed chat completion (/v1/chat/completions, SSE): calls `onDelta` with each
// delta and returns the usage the engine reports at the end.
import { ApiError, failure, headers, unreachable } from "./api.js";

export async function streamChat(body, { signal, onStart, onDelta }) {
  const resp = await fetch("/v1/chat/completions", {
    method: "POST",
    signal,
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  }).catch((e) => {
    if (e.name === "AbortError") throw e;
    throw unreachable();
  });
  if (!resp.ok) throw await failure(resp);
  onStart?.({ promptTokens: Number(resp.headers.get("x-perch-prompt-tokens") || 0) });
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(chunk.error.message, 500, chunk.error.code);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta) onDelta(delta);
    }
  }
  return usage;
}
