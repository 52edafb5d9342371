// The engine's state in the header pill and the banner; follows the engine to a new port.
import { $, api, explain } from "./api.js";

let lastStatus = null;

export async function pollStatus() {
  try {
    const s = await api("/perch/status");
    lastStatus = s;
    const pill = $("#status");
    pill.dataset.phase = s.phase;
    pill.textContent = s.loading ? `Loading ${s.loading}…` : s.phase === "running" ? `Running · ${s.model || "no model"}` : s.message;
    const banner = $("#banner");
    banner.hidden = !s.config_error;
    banner.textContent = s.config_error ? `Settings problem: ${s.config_error.message} — the engine keeps its last good settings.` : "";
    if (s.config_error && !$("#view-settings").hidden) $("#settings-error").textContent = s.config_error.message;
    // The engine moved to another port: follow it.
    if (s.url && !s.url.startsWith(location.origin) && location.protocol.startsWith("http") && location.hostname === "127.0.0.1") {
      location.href = s.url + "/" + location.hash;
    }
  } catch (e) {
    if (e.status === 404) {
      // `perch serve` without a settings file: the engine API only.
      try {
        const h = await api("/health");
        $("#status").dataset.phase = "running";
        $("#status").textContent = `Running · ${h.model ? h.model.id : "no model"}`;
      } catch (e2) {
        $("#status").textContent = explain(e2);
      }
    } else {
      $("#status").dataset.phase = "failed";
      $("#status").textContent = explain(e);
    }
  }
}

export const defaultModel = () => lastStatus && lastStatus.default_model;
