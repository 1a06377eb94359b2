import { defineConfig } from 'vite';

// The UI is served by the controller manager at `/` (same origin as the REST API), so asset URLs are absolute.
// `development` resolves @bis/api-client to its TypeScript sources, which Vite compiles.
export default defineConfig({
  root: import.meta.dirname,
  base: '/',
  resolve: { conditions: ['development', 'browser', 'module', 'import', 'default'] },
  build: { outDir: 'dist', emptyOutDir: true, target: 'es2022', sourcemap: true, reportCompressedSize: false },
  server: {
    // `vite` dev server: proxy the API to a running controller manager.
    proxy: { '/v1': { target: process.env['BIS_API'] ?? 'http://127.0.0.1:9500', ws: true } },
  },
});
