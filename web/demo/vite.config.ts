import { defineConfig } from 'vite';

/** An absolute file path next to this config (no Node types needed). */
const here = (relative: string): string => decodeURIComponent(new URL(relative, import.meta.url).pathname);

// The Plaza server the dev server (`npm run dev`) and `npm run preview` forward /v1 to:
// the HTTP API and the WebSocket at /v1/ws. In production `plaza serve --web-dir dist`
// serves the app and /v1 from one origin, so no proxy is involved. PLAZA_URL overrides it.
const env = (globalThis as { process?: { env: Record<string, string | undefined> } }).process?.env ?? {};
const plaza = env['PLAZA_URL'] ?? 'http://127.0.0.1:7700';
const proxy = { '/v1': { target: plaza, ws: true, changeOrigin: true } };

export default defineConfig({
  resolve: {
    // The client is compiled from source together with the app: no separate build of it.
    alias: { '@plaza/client': here('../../clients/ts/src/index.ts') },
  },
  server: {
    proxy,
    // Let the dev server read the client's sources outside this folder.
    fs: { allow: [here('../..')] },
  },
  preview: { proxy },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    sourcemap: true,
  },
});
