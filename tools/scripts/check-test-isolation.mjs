#!/usr/bin/env node
// Test-isolation check (part of `npm test`): tests read only what is in the repository, and hold on a loaded machine.
// Scans every spec and test-support file of libs/, apps/ and tools/ and fails when one names a path outside the
// repository: a folder beside the checkout (`../shared`, `/work/...`) or a relative path that climbs above the
// repository root from the file's own folder. Optional suites that need something outside the repository take its
// location from an environment variable and skip with a message when it is unset; they need no path in the source.
//
// It also fails on a spec that asserts an upper bound on wall-clock time (`expect(Date.now() - t0).toBeLessThan(…)`,
// directly or through a variable computed from `Date.now()`, `performance.now()` or `process.hrtime`): a loaded
// machine breaks such a bound. Tests wait for conditions (a hang is caught by the test's timeout), assert lower
// bounds, or measure on an injected clock.
//
//   node tools/scripts/check-test-isolation.mjs [root]
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';

const SKIP_DIRS = new Set(['node_modules', 'dist', 'out-tsc', 'build', 'coverage', '.nx', 'test-data']);

/** True for files that only tests load: specs, test-support folders, test/ folders, jest setup files. */
export function isTestFile(rel) {
  const parts = rel.split(sep);
  const name = parts[parts.length - 1];
  if (!/\.(ts|tsx|mts|cts|js|mjs|cjs)$/.test(name) || name.endsWith('.d.ts')) return false;
  return /\.(spec|test)\.[cm]?[jt]sx?$/.test(name) || parts.includes('test-support') || parts.includes('test') || parts.includes('testing');
}

function* walk(dir) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (SKIP_DIRS.has(e.name) || e.name.startsWith('.')) continue;
    const p = join(dir, e.name);
    if (e.isDirectory()) yield* walk(p);
    else if (e.isFile()) yield p;
  }
}

/** Every file of the projects (libs/, apps/, tools/) under `root`, with its path relative to `root`. */
function* projectFiles(root) {
  for (const top of ['libs', 'apps', 'tools']) {
    const base = join(root, top);
    if (!existsSync(base)) continue;
    for (const file of walk(base)) yield { file, rel: relative(root, file) };
  }
}

const OUTSIDE = [
  { re: /(?:^|[^.\w])\.\.\/(?:\.\.\/)*shared\b/, why: 'a folder beside the repository (../shared)' },
  { re: /['"`]\/work\//, why: 'an absolute path on the build host (/work/...)' },
  { re: /(?:REPO_ROOT|WORKSPACE_ROOT|repoRoot|workspaceRoot)\s*,\s*['"`]\.\.(?:\/|['"`])/, why: 'a path above the repository root' },
];
const RELATIVE = /['"`]((?:\.\.\/)+)[^'"`\s]*['"`]/g;

/** Every reference to a path outside the repository in the test files under `root`: `file:line: why`. */
export function outsideReferences(root) {
  const found = [];
  for (const { file, rel } of projectFiles(root)) {
    if (!isTestFile(rel)) continue;
    const depth = dirname(rel).split(sep).length; // levels between the file's folder and the root
    readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
      // a path traversal that a test sends as an attack, never reads: marked on its line with the reason
      if (line.includes('test-isolation: attack string')) return;
      // one finding per line: the first reason that applies
      let why = OUTSIDE.find(({ re }) => re.test(line))?.why;
      for (const m of why ? [] : line.matchAll(RELATIVE)) {
        const ups = m[1].length / 3;
        if (ups > depth) why ??= `"${m[0].slice(1, -1)}" climbs ${ups} levels from a folder ${depth} below the root`;
      }
      if (why) found.push(`${rel}:${i + 1}: ${why}: ${line.trim()}`);
    });
  }
  return found;
}

const NOW = String.raw`(?:Date\.now\(\)|performance\.now\(\)|process\.hrtime(?:\.bigint)?\()`;
const UPPER = /expect\(([^;]*?)\)\s*\.\s*(toBeLessThan|toBeLessThanOrEqual)\(/g;

/** Every assertion of an upper bound on wall-clock time in the spec files under `root`: `file:line: assertion`. */
export function wallClockUpperBounds(root) {
  const found = [];
  for (const { file, rel } of projectFiles(root)) {
    if (!/\.spec\.[cm]?[jt]sx?$/.test(rel)) continue;
    const text = readFileSync(file, 'utf8');
    // variables that hold a wall-clock difference: `const took = Date.now() - t0`
    const timed = [...text.matchAll(new RegExp(String.raw`(?:const|let|var)\s+(\w+)\s*=\s*[^;\n]*${NOW}[^;\n]*-`, 'g'))].map((m) => m[1]);
    const isTimed = (arg) => new RegExp(NOW).test(arg) || timed.some((v) => new RegExp(String.raw`\b${v}\b`).test(arg));
    text.split('\n').forEach((line, i) => {
      for (const m of line.matchAll(UPPER)) if (isTimed(m[1])) found.push(`${rel}:${i + 1}: ${line.trim()}`);
    });
  }
  return found;
}

if (resolve(process.argv[1] ?? '') === resolve(new URL(import.meta.url).pathname)) {
  const root = resolve(process.argv[2] ?? join(dirname(new URL(import.meta.url).pathname), '../..'));
  const found = outsideReferences(root);
  if (found.length) {
    console.error(`test isolation: ${found.length} reference(s) to paths outside the repository (copy test data into the repository):`);
    for (const f of found) console.error('  ' + f);
    process.exit(1);
  }
  console.log('test isolation: no test file references a path outside the repository');
  const bounds = wallClockUpperBounds(root);
  if (bounds.length) {
    console.error(`test isolation: ${bounds.length} assertion(s) of an upper bound on wall-clock time (wait for the condition, assert a lower bound or inject a clock):`);
    for (const f of bounds) console.error('  ' + f);
    process.exit(1);
  }
  console.log('test isolation: no spec asserts an upper bound on wall-clock time');
}
