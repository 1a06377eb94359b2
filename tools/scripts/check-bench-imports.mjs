#!/usr/bin/env node
// Checks that the benchmarks under tools/bench still fit the code they measure (run it after every build): each
// `const { a, b } = await import(path.join(<repo root>, 'libs/…/dist/….js'))` of a benchmark must name a built module
// that exports a and b, and each `import { a, b } from '@bis/…'` must name exports of that package. A benchmark is
// run by hand, seldom; without this, a name moved to another entry point breaks it unnoticed until someone measures.
//   node tools/scripts/check-bench-imports.mjs [--root <dir>]   (default: this repository)
//   node tools/scripts/check-bench-imports.mjs --self-test        (checks that a broken import is reported)
// Prints one line per problem and exits 1 when there is any; prints a summary and exits 0 otherwise.
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const DYNAMIC = /const\s*\{([^}]+)\}\s*=\s*await import\(\s*(?:path\.)?join\(\s*(?:repo|root|repoRoot)\s*,\s*'([^']+)'\s*\)\s*\)/g;
const STATIC = /^import\s*\{([^}]+)\}\s*from\s*'(@bis\/[^']+)'/gm;

/** The names a destructuring list binds from the module (`a`, `b: c` → a and b, `...rest` ignored). */
function names(list) {
  return list
    .split(',')
    .map((s) => s.trim().split(':')[0].trim())
    .filter((s) => s && !s.startsWith('...'));
}

/** Problems of the benchmarks of `root` (one string each). */
export async function checkBenchImports(root) {
  const dir = path.join(root, 'tools/bench');
  const problems = [];
  let checked = 0;
  const requireFrom = createRequire(path.join(dir, 'package.json'));
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.mjs')).sort()) {
    const text = readFileSync(path.join(dir, file), 'utf8');
    const uses = [];
    for (const m of text.matchAll(DYNAMIC)) uses.push({ spec: pathToFileURL(path.join(root, m[2])).href, shown: m[2], want: names(m[1]) });
    for (const m of text.matchAll(STATIC)) {
      let spec;
      try {
        spec = pathToFileURL(requireFrom.resolve(m[2])).href;
      } catch {
        spec = m[2];
      }
      uses.push({ spec, shown: m[2], want: names(m[1]) });
    }
    for (const u of uses) {
      checked++;
      let mod;
      try {
        mod = await import(u.spec);
      } catch (err) {
        problems.push(`tools/bench/${file}: cannot import ${u.shown}: ${err instanceof Error ? err.message.split('\n')[0] : String(err)}`);
        continue;
      }
      for (const n of u.want) if (!(n in mod)) problems.push(`tools/bench/${file}: ${u.shown} does not export ${n}`);
    }
  }
  return { problems, checked };
}

async function selfTest() {
  const root = mkdtempSync(path.join(tmpdir(), 'bis-bench-imports-'));
  try {
    mkdirSync(path.join(root, 'tools/bench'), { recursive: true });
    mkdirSync(path.join(root, 'libs/x/dist'), { recursive: true });
    writeFileSync(path.join(root, 'libs/x/dist/index.js'), 'export const kept = 1;\n');
    writeFileSync(
      path.join(root, 'tools/bench/b.mjs'),
      "const { kept, moved } = await import(path.join(repo, 'libs/x/dist/index.js'));\nconst { y } = await import(path.join(repo, 'libs/gone/dist/index.js'));\n",
    );
    const { problems } = await checkBenchImports(root);
    const want = ['tools/bench/b.mjs: libs/x/dist/index.js does not export moved', 'tools/bench/b.mjs: cannot import libs/gone/dist/index.js'];
    const ok = problems.length === 2 && problems[0] === want[0] && problems[1].startsWith(want[1]);
    console.log(ok ? 'check-bench-imports self-test: a missing export and a missing module are reported' : `check-bench-imports self-test FAILED: ${JSON.stringify(problems)}`);
    return ok ? 0 : 1;
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  if (args.includes('--self-test')) process.exit(await selfTest());
  const i = args.indexOf('--root');
  const root = i >= 0 ? path.resolve(args[i + 1]) : path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
  const { problems, checked } = await checkBenchImports(root);
  for (const p of problems) console.log(p);
  if (problems.length) process.exit(1);
  console.log(`benchmark imports: ${checked} imports of built modules checked: ok`);
}
