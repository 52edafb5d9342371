// Vite builds the pages into ui/dist (engine/build.rs compiles them into the engine).
// No inline scripts or styles, so the engine's strict CSP (script-src 'self') holds.
import { defineConfig } from "vite";

export default defineConfig({
  base: "/",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    // Inlined assets would become data: URLs; the CSP allows them for images only.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    target: "es2022",
    reportCompressedSize: false,
    // KaTeX's chunk (math.js, ~530 KB) loads only when an answer holds math.
    chunkSizeWarningLimit: 600,
  },
});
