// Debian's chromium, headless, as every browser script here starts it (CHROMIUM overrides
// the path). The sandbox and /dev/shm are off: CI containers have neither.
import { chromium } from "playwright-core";

export function launch(extraArgs = []) {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", ...extraArgs],
  });
}
