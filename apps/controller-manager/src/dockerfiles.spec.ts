import { spawn, spawnSync } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const SCRIPT = path.join(ROOT, 'tools/scripts/check-dockerfiles.mjs');

function check(args: string[]): { code: number | null; out: string; err: string } {
  const r = spawnSync(process.execPath, [SCRIPT, ...args], { encoding: 'utf8' });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

/** The default CMD of an app's Dockerfile (exec form). */
async function defaultCmd(app: string): Promise<string[]> {
  const text = await readFile(path.join(ROOT, 'apps', app, 'Dockerfile'), 'utf8');
  const line = text.split('\n').filter((l) => l.startsWith('CMD ')).at(-1)!;
  return JSON.parse(line.slice(4)) as string[];
}

describe('Dockerfiles', () => {
  // Built by the test target's dependencies (controller-manager, ui, backing-image-manager, backing-image-data-source).
  it('copy only paths that exist after the build, of projects the build stage builds, and run valid default commands', () => {
    const r = check([]);
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/^2 Dockerfile\(s\), \d+ paths and commands checked: ok/);
  });

  it('the controller-manager image builds the web UI and carries it where the daemon looks for it', async () => {
    const text = await readFile(path.join(ROOT, 'apps/controller-manager/Dockerfile'), 'utf8');
    expect(text).toMatch(/nx run-many -t build -p [^\n]*\bui\b/);
    expect(text).toContain('COPY --from=build /src/apps/ui/dist ./apps/ui/dist');
    // The daemon's default --ui-dir is apps/ui/dist next to apps/controller-manager, as copied above.
    const { defaultUiDir } = await import('./cli.js');
    expect(path.relative(path.join(ROOT, 'apps/controller-manager'), defaultUiDir())).toBe(path.join('..', 'ui', 'dist'));
  });

  it("the controller-manager's default CMD is the Kubernetes daemon, whose flags parse (it needs only the node name)", async () => {
    const cmd = await defaultCmd('controller-manager');
    expect(cmd.slice(0, 2)).toEqual(['controller-manager', 'daemon']);
    const env = { ...process.env };
    delete env['NODE_NAME'];
    // run as the image's `controller-manager` command runs it: the file itself, through its launcher line
    const r = spawnSync(path.join(ROOT, 'apps/controller-manager/bin/controller-manager.js'), cmd.slice(1), { encoding: 'utf8', env });
    // Every flag is known; what is missing outside a pod is $NODE_NAME (the downward API sets it in the DaemonSet).
    expect(r.stderr).toContain('--node-id is required');
    expect(r.stderr).not.toMatch(/Unknown option|unexpected argument/i);
    expect(r.status).toBe(2);
  });

  it('the controller-manager command runs node with semispaces of at most 8 MiB, and npm start runs that command', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'bis-launcher-'));
    try {
      const preload = path.join(dir, 'argv.cjs');
      await writeFile(preload, "process.stderr.write('EXECARGV ' + JSON.stringify(process.execArgv) + '\\n');\n");
      const r = spawnSync(path.join(ROOT, 'apps/controller-manager/bin/controller-manager.js'), ['--help'], { encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: `--require ${preload}` } });
      expect(r.stderr).toContain('EXECARGV ["--max-semi-space-size=8"]');
      expect(r.stdout + r.stderr).toContain('usage: controller-manager <mode> [options]');
      const pkg = JSON.parse(await readFile(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
      expect(pkg.scripts['start']).toMatch(/&& exec apps\/controller-manager\/bin\/controller-manager\.js standalone /);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  describe("the backing-image-manager's default CMD", () => {
    let dir: string;
    beforeAll(async () => {
      dir = await mkdtemp(path.join(os.tmpdir(), 'bis-dockerfile-cmd-'));
      // A Longhorn disk: the controller-manager of the node writes its longhorn-disk.cfg before any manager starts.
      await writeFile(path.join(dir, 'longhorn-disk.cfg'), JSON.stringify({ diskUUID: '0b5e5c1c-7d3e-4c1e-9a51-2b6f0d1f4e2a' }));
    });
    afterAll(async () => {
      await rm(dir, { recursive: true, force: true });
    });

    it('runs a manager daemon on the /data/ disk (here a temporary directory and loopback ports)', async () => {
      const cmd = await defaultCmd('backing-image-manager');
      expect(cmd).toEqual(['backing-image-manager', 'daemon', '--disk-path', '/data/']);
      const args = cmd.slice(1).map((a) => (a === '/data/' ? dir : a));
      const child = spawn(process.execPath, [path.join(ROOT, 'apps/backing-image-manager/bin/backing-image-manager.js'), ...args, '--listen', '127.0.0.1:0', '--sync-listen', '127.0.0.1:0'], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.on('data', (b: Buffer) => (out += b.toString()));
      child.stderr.on('data', (b: Buffer) => (err += b.toString()));
      try {
        const ready = await new Promise<string>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`no ready line within 60 s (stderr: ${err})`)), 60_000);
          child.stdout.on('data', () => {
            const line = out.split('\n').find((l) => l.includes('"ready":true'));
            if (line) {
              clearTimeout(timer);
              resolve(line);
            }
          });
          child.once('exit', (code) => {
            clearTimeout(timer);
            reject(new Error(`exited ${code}: ${err}`));
          });
        });
        expect(JSON.parse(ready)).toMatchObject({ ready: true });
      } finally {
        child.kill('SIGTERM');
        if (child.exitCode === null && child.signalCode === null) await new Promise((r) => child.once('exit', r));
      }
    }, 90_000);
  });

  describe('check-dockerfiles.mjs', () => {
    let root: string;
    beforeAll(async () => {
      root = await mkdtemp(path.join(os.tmpdir(), 'bis-dockerfile-check-'));
      await mkdir(path.join(root, 'apps/web/dist'), { recursive: true });
      await mkdir(path.join(root, 'apps/api/bin'), { recursive: true });
      await mkdir(path.join(root, 'apps/ui'), { recursive: true });
      await writeFile(path.join(root, 'package.json'), '{}');
      await writeFile(path.join(root, 'apps/api/package.json'), '{"exports":{"default":"./dist/index.js"}}');
      await writeFile(path.join(root, 'apps/api/bin/api.js'), '');
    });
    afterAll(async () => {
      await rm(root, { recursive: true, force: true });
    });

    it('reports a missing context file, an unbuilt app, an output of a project the stage does not build, a dangling link and a help-only CMD', async () => {
      const file = path.join(root, 'Dockerfile');
      await writeFile(
        file,
        [
          'FROM node:22 AS build',
          'WORKDIR /src',
          'COPY package.json missing.json ./',
          'COPY apps ./apps',
          '# a comment',
          'RUN npm install \\',
          ' && npx nx run-many -t build -p api',
          'FROM node:22',
          'WORKDIR /opt/x',
          'COPY --from=build /src/apps/api ./apps/api',
          'COPY --from=build /src/apps/web/dist ./apps/web/dist',
          'COPY --from=build /src/apps/ui/dist ./apps/ui/dist',
          'RUN ln -s /opt/x/apps/api/bin/api.js /usr/local/bin/api && ln -s /opt/x/apps/api/bin/nope.js /usr/local/bin/nope',
          'CMD ["api", "--help"]',
        ].join('\n'),
      );
      const r = check(['--root', root, file]);
      expect(r.code).toBe(1);
      expect(r.err).toContain('Dockerfile:3: COPY missing.json: no such file in the build context');
      expect(r.err).toContain('Dockerfile:10: COPY --from=build /src/apps/api: apps/api/dist does not exist after the build');
      expect(r.err).toContain('Dockerfile:11: COPY --from=build /src/apps/web/dist: stage build does not build project web');
      expect(r.err).toContain('Dockerfile:12: COPY --from=build /src/apps/ui/dist: apps/ui/dist does not exist after the build');
      expect(r.err).toContain('ln -s /opt/x/apps/api/bin/nope.js: apps/api/bin/nope.js does not exist');
      expect(r.err).toContain('CMD only prints a help text: api --help');
      expect(r.err).not.toContain('package.json');

      // Fixed: every path there, the apps built, a CMD that runs something.
      await writeFile(path.join(root, 'missing.json'), '{}');
      await mkdir(path.join(root, 'apps/api/dist'), { recursive: true });
      await mkdir(path.join(root, 'apps/ui/dist'), { recursive: true });
      await writeFile(path.join(root, 'apps/api/bin/nope.js'), '');
      const fixed = (await readFile(file, 'utf8')).replace('-p api', '-p api web ui').replace('CMD ["api", "--help"]', 'CMD ["api", "serve"]');
      await writeFile(file, fixed);
      const ok = check(['--root', root, file]);
      expect(ok.err).toBe('');
      expect(ok.code).toBe(0);
    });
  });
});
