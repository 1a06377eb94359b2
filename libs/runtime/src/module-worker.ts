import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { Worker, type WorkerOptions } from 'node:worker_threads';

/**
 * Module hooks that run a worker from its TypeScript sources: a relative `./x.js` import from a `.ts` module resolves
 * to `./x.ts` when there is no `./x.js`, and `.ts` modules are compiled with @swc/core (as jest does). Only used when
 * the compiled worker is missing, i.e. when the workspace runs from its sources (jest, the "development" condition).
 */
const SOURCE_HOOKS = `
import { readFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
let swc;
export function initialize(data) { swc = createRequire(data.swc)(data.swc); }
export async function resolve(specifier, context, next) {
  if (context.parentURL && context.parentURL.endsWith('.ts') && /^\\.\\.?\\//.test(specifier) && specifier.endsWith('.js')) {
    const js = new URL(specifier, context.parentURL);
    const ts = new URL(specifier.slice(0, -3) + '.ts', context.parentURL);
    if (!existsSync(js) && existsSync(ts)) return { url: ts.href, shortCircuit: true };
  }
  return next(specifier, context);
}
export async function load(url, context, next) {
  if (!url.startsWith('file:') || !url.endsWith('.ts')) return next(url, context);
  const source = await readFile(new URL(url), 'utf8');
  const out = swc.transformSync(source, {
    filename: url, sourceMaps: 'inline',
    jsc: { target: 'es2022', parser: { syntax: 'typescript' } }, module: { type: 'es6' },
  });
  return { format: 'module', source: out.code, shortCircuit: true };
}
`;

/** Registers {@link SOURCE_HOOKS} in the worker thread, then imports the worker's `.ts` module. */
const SOURCE_BOOTSTRAP = `
const { register } = require('node:module');
const [, , url, hooks, swc] = process.argv;
register('data:text/javascript,' + encodeURIComponent(hooks), { data: { swc } });
import(url).catch((e) => { process.nextTick(() => { throw e; }); });
`;

/**
 * Starts a worker thread running the ES module at `url`, the compiled `.js` next to the calling module
 * (`new URL('./x-worker.js', import.meta.url)`). When that file does not exist but `x-worker.ts` does (the workspace
 * runs from its TypeScript sources, as under jest), the `.ts` module runs instead, compiled on load.
 */
export function startModuleWorker(url: URL, options: WorkerOptions = {}): Worker {
  if (url.protocol !== 'file:' || !url.pathname.endsWith('.js') || existsSync(url)) return new Worker(url, options);
  const source = new URL(url.href.replace(/\.js$/, '.ts'));
  if (!existsSync(source)) return new Worker(url, options); // the Worker reports the missing module
  let swc: string;
  try {
    swc = createRequire(import.meta.url).resolve('@swc/core');
  } catch (e) {
    throw new Error(`${url.pathname} is not built, and running ${source.pathname} from its sources needs @swc/core`, {
      cause: e,
    });
  }
  return new Worker(SOURCE_BOOTSTRAP, {
    ...options,
    eval: true,
    argv: [source.href, SOURCE_HOOKS, swc, ...(options.argv ?? [])],
  });
}
