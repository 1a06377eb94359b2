import { describe, expect, it, afterAll } from '@jest/globals';
import { execFile } from 'node:child_process';
import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { FIXTURE_STORE, REPO_ROOT, tempDir } from './test-support/images.js';

// The rule: tests read only what is in the repository (test data such as the Longhorn fixture is stored under
// libs/<name>/test-data/). tools/scripts/check-test-isolation.mjs enforces it over every spec and test-support file.
const CHECK = path.join(REPO_ROOT, 'tools/scripts/check-test-isolation.mjs');

function check(root: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [CHECK, root], (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, out: stdout + stderr });
    });
  });
}

// Built from pieces so that this file does not contain what it plants.
const BESIDE = '..' + '/shared/fixtures/longhorn-backupstore-lz4';
const HOST = '/wo' + 'rk/shared/reference/longhorn-backupstore-format.md';
const CLIMB = '../../../.' + './outside/data';
const ROOT_UP = 'REPO_' + "ROOT, '..'";

let work: string | undefined;
afterAll(async () => {
  if (work) await fs.rm(work, { recursive: true, force: true });
});

async function plant(root: string, rel: string, text: string): Promise<void> {
  await fs.mkdir(path.dirname(path.join(root, rel)), { recursive: true });
  await fs.writeFile(path.join(root, rel), text);
}

describe('test isolation', () => {
  it('the Longhorn fixture is inside the repository', () => {
    expect(path.relative(REPO_ROOT, FIXTURE_STORE)).toBe(path.join('libs', 'backupstore', 'test-data', 'longhorn-backupstore-lz4'));
  });

  it('no spec or test-support file of the repository references a path outside it', async () => {
    const r = await check(REPO_ROOT);
    expect(r.out).toContain('no test file references a path outside the repository');
    expect(r.code).toBe(0);
  });

  it('the check finds folders beside the repository, host paths and paths climbing above the root, in test files only', async () => {
    work = await tempDir('bis-test-isolation-');
    await plant(work, 'libs/a/src/a.spec.ts', `const F = path.resolve(REPO_ROOT, '${BESIDE}');\n`);
    await plant(work, 'libs/a/src/test-support/t.ts', `export const DOC = '${HOST}';\n`);
    await plant(work, 'apps/b/src/b.spec.ts', `const X = path.resolve(dir, '${CLIMB}');\n`);
    await plant(work, 'apps/b/src/c.spec.ts', `const Y = path.resolve(${ROOT_UP}, 'elsewhere');\n`);
    // allowed: paths inside the repository, and non-test sources (they are checked elsewhere)
    await plant(work, 'libs/a/src/ok.spec.ts', `const G = path.resolve(HERE, '../../test-data/x');\nconst H = path.join(REPO_ROOT, 'libs/a/test-data');\n`);
    await plant(work, 'libs/a/src/lib.ts', `// see '${BESIDE}'\n`);
    const r = await check(work);
    expect(r.code).toBe(1);
    expect(r.out).toContain('4 reference(s)');
    expect(r.out).toMatch(/libs\/a\/src\/a\.spec\.ts:1: a folder beside the repository/);
    expect(r.out).toMatch(/libs\/a\/src\/test-support\/t\.ts:1: an absolute path on the build host/);
    expect(r.out).toMatch(/apps\/b\/src\/b\.spec\.ts:1: "\.\.\/\.\.\/\.\.\/\.\.\/outside\/data" climbs 4 levels/);
    expect(r.out).toMatch(/apps\/b\/src\/c\.spec\.ts:1: a path above the repository root/);
    expect(r.out).not.toContain('ok.spec.ts');
    expect(r.out).not.toContain('lib.ts');
  });

  it('no spec asserts an upper bound on wall-clock time, and the check finds one planted, directly or through a variable', async () => {
    expect((await check(REPO_ROOT)).out).toContain('no spec asserts an upper bound on wall-clock time');
    const root = await tempDir('bis-test-clock-');
    try {
      const NOW = 'Date' + '.now()';
      const BELOW = '.toBeLess' + 'Than';
      await plant(root, 'libs/a/src/a.spec.ts', `expect(${NOW} - t0)${BELOW}(2000);\n`);
      await plant(root, 'apps/b/src/b.spec.ts', `const took = performance.now() - t0;\nexpect(took).toBeGreaterThan(10);\nexpect(took)${BELOW}OrEqual(99);\n`);
      // allowed: lower bounds, bounds on an injected clock, bounds on other numbers
      await plant(root, 'libs/a/src/ok.spec.ts', `expect(${NOW} - t0).toBeGreaterThanOrEqual(2000);\nexpect(clock.now() - t0)${BELOW}(80);\nexpect(size)${BELOW}(4);\n`);
      const r = await check(root);
      expect(r.code).toBe(1);
      expect(r.out).toContain('2 assertion(s) of an upper bound on wall-clock time');
      expect(r.out).toMatch(/libs\/a\/src\/a\.spec\.ts:1: expect\(Date\.now\(\) - t0\)\.toBeLessThan\(2000\)/);
      expect(r.out).toMatch(/apps\/b\/src\/b\.spec\.ts:3: expect\(took\)\.toBeLessThanOrEqual\(99\)/);
      expect(r.out).not.toContain('ok.spec.ts');
    } finally {
      await fs.rm(root, { recursive: true, force: true });
    }
  });
});
