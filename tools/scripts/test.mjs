#!/usr/bin/env node
// `npm test`: every check and every test suite of the workspace.
//   1. module boundaries (libs never import apps, no cycles), and test isolation (tests read nothing outside the repository)
//   2. lint: ESLint with typescript-eslint's type-aware rules over every TypeScript source (eslint.config.mjs)
//   3. Nx project references in sync
//   4. typecheck, then every build, then jest, for every project (nx run-many), two at a time; after the builds, the
//      benchmarks' imports of built modules are checked (tools/scripts/check-bench-imports.mjs; all projects only)
//   5. the `*.alone.spec.ts` tests, one project at a time, after every other test (jest.base.js says why)
//   6. one closing line with the totals of every jest project
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '../..');
const summaryDir = mkdtempSync(join(tmpdir(), 'bis-test-summary-'));
const env = {
  ...process.env,
  NX_NO_CLOUD: 'true',
  NX_DAEMON: 'false',
  NX_TUI: 'false',
  BIS_TEST_SUMMARY_DIR: summaryDir,
  BIS_WORKSPACE_ROOT: root,
};

function run(cmd, args, extraEnv = {}) {
  console.log(`\n$ ${Object.entries(extraEnv).map(([k, v]) => `${k}=${v} `).join('')}${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { stdio: 'inherit', env: { ...env, ...extraEnv }, cwd: root });
  return r.status ?? 1;
}

/** The Nx projects (package names) with a `*.alone.spec.ts` under src/ or test/. */
function projectsWithAloneTests() {
  const found = [];
  for (const group of ['apps', 'libs']) {
    for (const dir of readdirSync(join(root, group))) {
      const base = join(root, group, dir);
      const has = ['src', 'test'].some((sub) => {
        const d = join(base, sub);
        return existsSync(d) && readdirSync(d, { recursive: true }).some((f) => String(f).endsWith('.alone.spec.ts'));
      });
      if (has) found.push(JSON.parse(readFileSync(join(base, 'package.json'), 'utf8')).name);
    }
  }
  return found;
}

function summarise(nxStatus) {
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  const lines = [];
  for (const f of readdirSync(summaryDir).sort()) {
    const s = JSON.parse(readFileSync(join(summaryDir, f), 'utf8'));
    passed += s.passed;
    failed += s.failed + s.runtimeErrorSuites;
    skipped += s.skipped;
    lines.push(`  ${s.project}: ${s.passed} passed, ${s.failed} failed${s.runtimeErrorSuites ? `, ${s.runtimeErrorSuites} suites did not run` : ''}`);
  }
  rmSync(summaryDir, { recursive: true, force: true });
  console.log('\nTest projects:');
  for (const l of lines) console.log(l);
  if (nxStatus !== 0 && failed === 0) failed = 1; // a typecheck or build failure counts as a failure
  console.log(`Tests: ${passed} passed, ${failed} failed, ${skipped} skipped`);
  return failed === 0 && nxStatus === 0 ? 0 : 1;
}

const extra = process.argv.slice(2);
if (run('node', ['tools/scripts/check-boundaries.mjs']) !== 0) process.exit(1);
if (run('node', ['tools/scripts/check-test-isolation.mjs']) !== 0) process.exit(1);
if (run('npx', ['--no-install', 'eslint', '.']) !== 0) process.exit(1);
if (!process.env.BIS_SKIP_SYNC_CHECK && run('npx', ['--no-install', 'nx', 'sync:check']) !== 0) process.exit(1);
const reporter = join(root, 'tools/jest/summary-reporter.js');
const typecheck = run('npx', ['--no-install', 'nx', 'run-many', '-t', 'typecheck', '--parallel=2', '--outputStyle=static', ...extra]);
// Every build before any test, in a run of its own: a build restored from the cache while a test runs would replace
// the files under a process the test started (`tsc --build` of typecheck rewrites build info the build target owns, so
// a build after it is restored, not kept). The test run then runs the tests only. (With a project selection in the
// arguments the test run keeps its dependencies: the builds those tests need may be outside the selection.)
const builds = run('npx', ['--no-install', 'nx', 'run-many', '-t', 'build', '--parallel=2', '--outputStyle=static', ...extra]);
// The benchmarks are run by hand: an import of theirs that no longer fits the built code is found here, not when
// someone measures. Only when every project was built (no project selection).
const benchImports =
  builds === 0 && extra.length === 0
    ? run('node', ['tools/scripts/check-bench-imports.mjs', '--self-test']) || run('node', ['tools/scripts/check-bench-imports.mjs'])
    : 0;
const tests = run('npx', [
  '--no-install', 'nx', 'run-many', '-t', 'test', '--parallel=2', '--outputStyle=static', ...(extra.length === 0 ? ['--excludeTaskDependencies'] : []), ...extra,
  '--', '--reporters=default', `--reporters=${reporter}`,
], { BIS_TEST_PHASE: 'shared' });
// Then the tests that rewrite built files, alone. With project arguments, the selected projects (those without such a
// test pass with none); otherwise the projects that have one.
const alone = projectsWithAloneTests();
const aloneTests =
  extra.length === 0 && alone.length === 0
    ? 0
    : run('npx', [
        '--no-install', 'nx', 'run-many', '-t', 'test', '--parallel=1', '--outputStyle=static', '--excludeTaskDependencies',
        ...(extra.length === 0 ? ['-p', ...alone] : extra),
        '--', '--passWithNoTests', '--reporters=default', `--reporters=${reporter}`,
      ], { BIS_TEST_PHASE: 'alone' });
process.exit(summarise(typecheck || builds || benchImports || tests || aloneTests));
