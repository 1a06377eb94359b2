/**
 * Every program of the system answers `--help` (and each of its commands' `--help`) with its usage on stdout and
 * exit status 0: the built bins, run as a user runs them.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from '@jest/globals';

const APPS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const bin = (app: string) => path.join(APPS, app, 'bin', `${app}.js`);

function run(app: string, args: string[]): { status: number | null; stdout: string; stderr: string } {
  const env: NodeJS.ProcessEnv = { ...process.env, NODE_OPTIONS: '' };
  delete env['BIS_LIVENESS_FD'];
  const r = spawnSync(process.execPath, [bin(app), ...args], { env, encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The commands of bictl, read from its own help (`  image ls   summary`). */
function bictlCommands(): string[][] {
  const help = run('bictl', ['--help']).stdout;
  const section = help.slice(help.indexOf('Commands:'));
  return [...section.matchAll(/^ {2}(\S+) (\S+) {2,}/gm)].map((m) => [m[1]!, m[2]!]);
}

const CASES: [string, string[], RegExp][] = [
  ['controller-manager', ['--help'], /usage: controller-manager <mode>/],
  ['controller-manager', ['-h'], /usage: controller-manager <mode>/],
  ['controller-manager', ['standalone', '--help'], /usage: controller-manager standalone/],
  ['controller-manager', ['daemon', '--help'], /usage: controller-manager daemon/],
  ['backing-image-manager', ['--help'], /usage: backing-image-manager daemon/],
  ['backing-image-manager', ['daemon', '--help'], /usage: backing-image-manager daemon/],
  ['backing-image-data-source', ['--help'], /usage: backing-image-data-source/],
  ['backup-engine', ['--help'], /usage: backup-engine <command>/],
  ...['backup', 'restore', 'ls', 'inspect', 'rm', 'gc', 'verify'].map((c): [string, string[], RegExp] => ['backup-engine', [c, '--help'], /usage: backup-engine/]),
  ['bictl', ['--help'], /bictl: manage backing images/],
];

describe('every bin answers --help with its usage and exit 0', () => {
  it('the bins are built', () => {
    for (const app of ['controller-manager', 'backing-image-manager', 'backing-image-data-source', 'backup-engine', 'bictl']) {
      expect(existsSync(path.join(APPS, app, 'dist', 'main.js'))).toBe(true); // built by the test target's dependencies
    }
  });

  it.each(CASES)('%s %j', (app, args, usage) => {
    const r = run(app, args);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(usage);
    expect(r.status).toBe(0);
  }, 60_000);

  it('bictl <group> <command> --help for every command of its help', () => {
    const commands = bictlCommands();
    expect(commands.length).toBeGreaterThan(10);
    for (const c of commands) {
      const r = run('bictl', [...c, '--help']);
      expect({ c, stderr: r.stderr, status: r.status }).toEqual({ c, stderr: '', status: 0 });
      expect(r.stdout).toContain(`Usage: bictl ${c.join(' ')}`);
    }
  }, 300_000);

  it('without a mode or with an unknown one, controller-manager prints the usage on stderr and exits 2', () => {
    const none = run('controller-manager', []);
    expect(none.status).toBe(2);
    expect(none.stderr).toMatch(/usage: controller-manager <mode>/);
    const bad = run('controller-manager', ['bogus']);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain('unknown mode "bogus"');
  }, 60_000);
});
