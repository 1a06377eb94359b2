import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** Runs in Node's module-hooks thread: appends the URL of every ES module loaded to the list file. */
const HOOKS = `
import { appendFileSync } from 'node:fs';
let out;
export function initialize(data) { out = data.out; }
export async function load(url, context, next) { appendFileSync(out, url + '\\n'); return next(url, context); }
`;

/** Preloaded with `--import`: registers the hooks; at exit appends the CommonJS modules (require cache). */
const preloadSource = (out: string): string => `
import { register, createRequire } from 'node:module';
import { appendFileSync } from 'node:fs';
const out = ${JSON.stringify(out)};
register('data:text/javascript,' + encodeURIComponent(${JSON.stringify(HOOKS)}), { data: { out } });
process.on('exit', () => {
  const cache = createRequire(import.meta.url).cache;
  appendFileSync(out, Object.keys(cache).map((k) => 'file://' + k + '\\n').join(''));
});
`;

export interface ModuleRecorder {
  /** Node arguments that make a process record the modules it loads. */
  nodeArgs: string[];
  /** The files of the modules loaded (ES and CommonJS), once the process has exited. */
  loadedFiles(): Promise<string[]>;
}

/** A recorder of the modules a child Node process loads, writing its files into `dir`. */
export async function createModuleRecorder(dir: string): Promise<ModuleRecorder> {
  const out = path.join(dir, 'loaded-modules.txt');
  const preload = path.join(dir, 'module-recorder.mjs');
  await writeFile(out, '');
  await writeFile(preload, preloadSource(out));
  return {
    nodeArgs: ['--import', preload],
    async loadedFiles() {
      const lines = (await readFile(out, 'utf8')).split('\n').filter((l) => l.startsWith('file://'));
      return [...new Set(lines.map((l) => fileURLToPath(l)))].filter((f) => f !== preload);
    },
  };
}
