/**
 * The built `bictl` against the real system: `controller-manager standalone` (controllers, data-source and manager
 * processes, REST API) started as a child process with a fresh data directory.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, statfs, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, it, expect, beforeAll, afterAll } from '@jest/globals';
import { startFileServer } from '@bis/api-client/test-support';
import { startStandaloneProcess, type StandaloneProcess } from '@bis/standalone/testing';

const BIN = resolve(import.meta.dirname, '../bin/bictl.js');

/** The REST API's bearer token: the system runs with --auth-token-file, so every call below is authenticated. */
const TOKEN = 'bictl-standalone-test-token-0123456789';

function bictl(args: string[], token: string | null = TOKEN): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((res, rej) => {
    const env: NodeJS.ProcessEnv = { ...process.env, NODE_OPTIONS: '', BICTL_SERVER: sys.url };
    delete env['BICTL_TOKEN'];
    if (token !== null) env['BICTL_TOKEN'] = token;
    const child = spawn(process.execPath, [BIN, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d));
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    child.on('error', rej);
    child.on('close', (code) => res({ code, stdout, stderr }));
  });
}

let sys: StandaloneProcess;

/** Runs bictl until its output satisfies `ok` (the system converges meanwhile); returns that output. */
async function eventuallyOutput(args: string[], ok: (out: string) => boolean, timeoutMs = 60_000): Promise<string> {
  const end = Date.now() + timeoutMs;
  let last = '';
  for (;;) {
    const r = await bictl(args);
    last = `${r.stdout}${r.stderr}`;
    if (r.code === 0 && ok(r.stdout)) return r.stdout;
    if (Date.now() > end) throw new Error(`bictl ${args.join(' ')} never gave the expected output; last:\n${last}`);
    await new Promise((res) => setTimeout(res, 300));
  }
}

describe('bictl against controller-manager standalone', () => {
  let files: { url: string; close(): Promise<void> };
  let dir: string;
  // A multiple of 512 bytes: the system zero-pads other sizes, and the SHA-512 covers the stored (padded) file.
  const image = randomBytes(4 << 20);
  const sha512 = createHash('sha512').update(image).digest('hex');

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bictl-sa-'));
    files = await startFileServer({ '/base.raw': image });
    await writeFile(join(dir, 'token'), `${TOKEN}\n`, { mode: 0o600 });
    sys = await startStandaloneProcess({ disks: 3, extraArgs: ['--auth-token-file', join(dir, 'token')] });
  }, 60_000);
  afterAll(async () => {
    await sys?.stop();
    await files?.close();
    await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('without BICTL_TOKEN (or with a wrong one) the API answers 401 and bictl says to set BICTL_TOKEN', async () => {
    const none = await bictl(['image', 'ls'], null);
    expect(none.code).toBe(1);
    expect(none.stderr).toContain('authentication required');
    expect(none.stderr).toContain('set BICTL_TOKEN');
    const wrong = await bictl(['image', 'ls'], 'not-the-token-0123456789');
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain('invalid bearer token');
    expect(wrong.stderr).toContain('BICTL_TOKEN is not it');
  }, 30_000);

  it('creates from a URL and waits for the copies, then lists it', async () => {
    const c = await bictl(['image', 'create', 'base', '--url', `${files.url}/base.raw`, '--checksum', sha512, '--min-copies', '2', '--wait', '--timeout', '60s']);
    expect(c.stderr).toBe('');
    // At least the 2 requested copies are ready (the system may be placing more at that moment).
    expect(c.stdout).toMatch(/^backing image base is ready \((\d)\/\d ready[^)]*\)\n$/);
    expect(Number(/\((\d)\//.exec(c.stdout)![1])).toBeGreaterThanOrEqual(2);
    expect(c.code).toBe(0);
    const j = JSON.parse((await bictl(['image', 'get', 'base', '-o', 'json'])).stdout);
    expect(j.currentChecksum).toBe(sha512);
    expect(j.size).toBe(image.length);
    expect((await bictl(['image', 'ls'])).stdout).toMatch(/base\s+4\.00 MiB\s+4\.00 MiB\s+download http:\/\/127\.0\.0\.1:\d+\/base\.raw\s+ready\s+\d\/\d\s+\d+%/);
  }, 90_000);

  it('fails with exit 1 and both checksums on a mismatch', async () => {
    const bad = await bictl(['image', 'create', 'bad', '--url', `${files.url}/base.raw`, '--checksum', 'e'.repeat(128), '--min-copies', '1', '--wait', '--timeout', '60s']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain(`the expected checksum ${'e'.repeat(128)} doesn't match the file actual checksum ${sha512}`);
    // `image get` shows why per disk and lists the events as `kubectl describe` does.
    const got = await eventuallyOutput(['image', 'get', 'bad'], (o) => /^ {2}Warning +Failed /m.test(o));
    expect(got).toMatch(/^DISK +STATE +PROGRESS +RETRIES +NEXT RETRY +MESSAGE$/m);
    expect(got).toContain(`the expected checksum ${'e'.repeat(128)} doesn't match the file actual checksum ${sha512}`);
    expect(got).toMatch(/^Events:\n {2}Type +Reason +Age +From +Message\n {2}-{4} +-{6} +-{3} +-{4} +-{7}$/m);
    expect(got).toMatch(/^ {2}Normal +Create +\d+[smhd].* longhorn-backing-image-controller +Backing image bad created from source type download$/m);
    expect(got).toMatch(new RegExp(`^ {2}Warning +Failed +\\d+[smhd].* longhorn-backing-image-data-source-controller +The data source of backing image bad failed: .*the expected checksum ${'e'.repeat(128)} doesn't match`, 'm'));
    expect((await bictl(['image', 'rm', 'bad', '--wait', '--timeout', '60s'])).code).toBe(0);
  }, 90_000);

  it('a 404 origin: image get shows the failure, its retry count and the next retry time', async () => {
    expect((await bictl(['image', 'create', 'gone', '--url', `${files.url}/no-such.raw`, '--min-copies', '1'])).code).toBe(0);
    const got = await eventuallyOutput(['image', 'get', 'gone'], (o) => /got 404/.test(o) && /^\S+ +failed\S* +\d+% +1 +\S+Z \((in|due)/m.test(o));
    expect(got).toContain(`expected status code 200 from ${files.url}/no-such.raw, got 404`);
    expect(got).toMatch(/attempt 1 failed; next attempt at \S+Z\]/);
    expect(got).toMatch(/^ {2}Warning +Failed .*got 404/m);
    expect((await bictl(['image', 'rm', 'gone', '--wait', '--timeout', '60s'])).code).toBe(0);
  }, 90_000);

  it('uploads a file through the REST proxy (resumable protocol) and downloads it back verified', async () => {
    const path = join(dir, 'up.img');
    const data = randomBytes(3 << 20);
    await writeFile(path, data);
    const up = await bictl(['image', 'upload', 'up', path, '--min-copies', '1', '--wait', '--timeout', '60s']);
    expect(up.stderr).toBe('');
    expect(up.stdout).toBe('uploaded 3.00 MiB to backing image up (1/1 ready)\n');
    const out = join(dir, 'up.out');
    const dl = await bictl(['image', 'download', 'up', out]);
    expect(dl.stderr).toBe(`downloaded 3.00 MiB to ${out} (SHA-512 verified)\n`);
    expect((await readFile(out)).equals(data)).toBe(true);
  }, 90_000);

  it('an upload the server failed says so at once, and so does a resume of it, with the reason and what to do', async () => {
    const path = join(dir, 'upbad.img');
    const data = randomBytes(2 << 20);
    await writeFile(path, data);
    const actual = createHash('sha512').update(data).digest('hex');
    const wrong = 'e'.repeat(128);
    const first = await bictl(['image', 'upload', 'upbad', path, '--checksum', wrong, '--min-copies', '1']);
    // The server checks the checksum after the last byte: when its failure already shows at the end of the upload,
    // the upload says so; otherwise it reports the bytes uploaded.
    if (first.code === 0) expect(first.stdout).toBe('uploaded 2.00 MiB to backing image upbad\n');
    else {
      expect(first.code).toBe(1);
      // from the answer to the last part, or from the image's status when the server ended the upload first
      expect(first.stderr).toMatch(/the upload of backing image upbad failed on the server: (failed to process sync file: )?the expected checksum/);
      expect(first.stderr).toContain(`the expected checksum ${wrong} doesn't match the file actual checksum ${actual}`);
    }
    for (let i = 0; ; i++) {
      const j = JSON.parse((await bictl(['image', 'get', 'upbad', '-o', 'json'])).stdout) as { diskFileStatusMap: Record<string, { state: string }> };
      if (Object.values(j.diskFileStatusMap).some((f) => f.state.startsWith('failed'))) break;
      if (i > 200) throw new Error(`the upload did not fail: ${JSON.stringify(j)}`);
      await new Promise((r) => setTimeout(r, 300));
    }
    // Running it again (the documented way to resume) fails at once with the same reason, not after the client's
    // 2-minute wait for an upload server that will never come back.
    const again = await bictl(['image', 'upload', 'upbad', path]);
    expect(again.code).toBe(1);
    expect(again.stderr).not.toContain('resuming');
    expect(again.stderr).not.toContain('has not been initiated');
    expect(again.stderr).toContain(`the upload of backing image upbad failed on the server: failed to process sync file: the expected checksum ${wrong} doesn't match the file actual checksum ${actual}`);
    expect(again.stderr).toContain('it cannot be resumed: delete it (bictl image rm upbad --wait) and run the upload again');
    expect((await bictl(['image', 'rm', 'upbad', '--wait', '--timeout', '60s'])).code).toBe(0);
  }, 90_000);

  it('keeps the HA guard on cleanup and removes copies after lowering min copies', async () => {
    const j = JSON.parse((await bictl(['image', 'get', 'base', '-o', 'json'])).stdout) as { diskFileStatusMap: Record<string, { state: string }> };
    const ready = Object.entries(j.diskFileStatusMap).filter(([, f]) => f.state === 'ready').map(([d]) => d);
    expect(ready.length).toBeGreaterThanOrEqual(2);
    const refused = await bictl(['image', 'cleanup', 'base', ...ready.flatMap((d) => ['--disk', d])]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('no enough ready files for HA');
    expect((await bictl(['image', 'min-copies', 'base', '1'])).code).toBe(0);
    const gone = ready.slice(1);
    const ok = await bictl(['image', 'cleanup', 'base', ...gone.flatMap((d) => ['--disk', d])]);
    expect(ok.stderr).toBe('');
    for (let i = 0; i < 100; i++) {
      const now = JSON.parse((await bictl(['image', 'get', 'base', '-o', 'json'])).stdout) as { diskFileStatusMap: Record<string, unknown> };
      if (gone.every((d) => !(d in now.diskFileStatusMap))) {
        expect(Object.keys(now.diskFileStatusMap)).toEqual([ready[0]]);
        return;
      }
      await new Promise((r) => setTimeout(r, 300));
    }
    throw new Error(`the copies on ${gone.join(', ')} were not removed`);
  }, 90_000);

  it('secrets: set from arguments and an env file, list keys only, never print a value, rm', async () => {
    const envFile = join(dir, 'creds.env');
    await writeFile(envFile, '# S3 credentials\nexport AWS_ACCESS_KEY_ID="env-key-id-value"\n\nAWS_SECRET_ACCESS_KEY=env-secret-value\n');
    const a = await bictl(['secret', 'set', 'cred-a', 'AWS_ACCESS_KEY_ID=arg-key-value', 'AWS_SECRET_ACCESS_KEY=arg-secret-value']);
    expect(a.stderr).toBe('');
    expect(a.stdout).toBe('secret cred-a set (keys: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)\n');
    const b = await bictl(['secret', 'set', 'cred-b', '--from-env-file', envFile, '-o', 'json']);
    expect(JSON.parse(b.stdout)).toEqual({ name: 'cred-b', keys: ['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY'] });
    const ls = await bictl(['secret', 'ls']);
    expect(ls.stdout).toMatch(/^NAME\s+KEYS\ncred-a\s+AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY\ncred-b\s+AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY\n$/);
    const all = [a, b, ls, await bictl(['secret', 'ls', '-o', 'yaml'])].map((r) => r.stdout + r.stderr).join('\n');
    for (const value of ['arg-key-value', 'arg-secret-value', 'env-key-id-value', 'env-secret-value']) expect(all).not.toContain(value);
    const bad = await bictl(['secret', 'set', 'cred-c', 'no-equals-sign-secret']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).not.toContain('no-equals-sign-secret');
    expect((await bictl(['secret', 'rm', 'cred-b'])).stdout).toBe('secret cred-b deleted\n');
    const gone = await bictl(['secret', 'rm', 'cred-b']);
    expect(gone.code).toBe(3);
    expect(gone.stderr).toBe('bictl: secret cred-b not found\n');
  }, 30_000);

  it("targets: ls and get show URL, secret, availability and message; set changes them; an unknown target is exit 3", async () => {
    const before = JSON.parse((await bictl(['target', 'get', 'default', '-o', 'json'])).stdout) as { backupTargetURL: string; pollInterval: string; available: boolean };
    expect(before.backupTargetURL).toMatch(/^vfs:\/\//);
    expect((await bictl(['target', 'ls'])).stdout).toMatch(/^NAME\s+URL\s+SECRET\s+POLL-INTERVAL\s+AVAILABLE\s+MESSAGE\ndefault\s+vfs:\/\/\S+\s+-\s+\S+\s+true\n$/);
    const unknown = await bictl(['target', 'get', 'nope']);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toBe('bictl: backup target nope not found\n');
    const setUnknown = await bictl(['target', 'set', 'nope', '--poll-interval', '10s']);
    expect(setUnknown.code).toBe(3);
    expect(setUnknown.stderr).toBe('bictl: backup target nope not found\n');
    expect((await bictl(['target', 'set', 'default'])).code).toBe(2);
    expect((await bictl(['target', 'set', 'default', '--poll-interval', 'soon'])).stderr).toContain('invalid pollInterval "soon"');

    // An S3 target whose secret lacks the access keys: unavailable, and the target says why.
    expect((await bictl(['secret', 'set', 'no-keys', 'AWS_ENDPOINTS=http://127.0.0.1:9'])).code).toBe(0);
    const set = await bictl(['target', 'set', 'default', '--url', 's3://bis-bucket@us-east-1/', '--secret', 'no-keys', '--poll-interval', '2s']);
    expect(set.stderr).toBe('');
    expect(set.stdout).toBe('backup target default updated (s3://bis-bucket@us-east-1/)\n');
    let shown = '';
    for (let i = 0; i < 100 && !/missing AWS_ACCESS_KEY_ID/.test(shown); i++) {
      shown = (await bictl(['target', 'get', 'default'])).stdout;
      if (!/missing AWS_ACCESS_KEY_ID/.test(shown)) await new Promise((r) => setTimeout(r, 300));
    }
    expect(shown).toMatch(/URL:\s+s3:\/\/bis-bucket@us-east-1\/\n/);
    expect(shown).toMatch(/Credential secret:\s+no-keys\n/);
    expect(shown).toMatch(/Poll interval:\s+2s\n/);
    expect(shown).toMatch(/Available:\s+false\n/);
    expect(shown).toMatch(/Message:\s+.*missing AWS_ACCESS_KEY_ID/);

    // Back to the filesystem target for the backups below.
    const back = await bictl(['target', 'set', 'default', '--url', before.backupTargetURL, '--secret', '', '--poll-interval', before.pollInterval]);
    expect(back.code).toBe(0);
    for (let i = 0; i < 100; i++) {
      const t = JSON.parse((await bictl(['target', 'get', 'default', '-o', 'json'])).stdout) as { available: boolean; credentialSecret: string };
      if (t.available) {
        expect(t.credentialSecret).toBe('');
        return;
      }
      await new Promise((r) => setTimeout(r, 300));
    }
    throw new Error('the default target did not become available again');
  }, 90_000);

  it('--wait ends when every disk the selectors allow has a ready copy, with a warning naming the shortfall', async () => {
    const c = await bictl(['image', 'create', 'short', '--url', `${files.url}/base.raw`, '--min-copies', '4', '--wait', '--timeout', '90s']);
    expect(c.stderr).toBe('bictl: warning: minNumberOfCopies 4 exceeds the 3 disks that the selectors allow; 3 of 4 copies are ready, on every disk that can hold one\n');
    expect(c.stdout).toBe('backing image short is ready (3/3 ready)\n');
    expect(c.code).toBe(0);
    const g = await bictl(['image', 'get', 'short']);
    expect(g.stdout).toMatch(/Warning:\s+minNumberOfCopies 4 exceeds the 3 disks that the selectors allow\n/);
    const j = JSON.parse((await bictl(['image', 'get', 'short', '-o', 'json'])).stdout) as { conditions: { type: string; status: string; reason: string }[] };
    expect(j.conditions).toEqual([expect.objectContaining({ type: 'MinCopiesSatisfiable', status: 'False', reason: 'NotEnoughDisks' })]);
    expect((await bictl(['image', 'min-copies', 'short', '3'])).code).toBe(0);
    for (let i = 0; i < 100; i++) {
      const now = JSON.parse((await bictl(['image', 'get', 'short', '-o', 'json'])).stdout) as { conditions: { type: string; status: string }[] };
      if (now.conditions.some((x) => x.type === 'MinCopiesSatisfiable' && x.status === 'True')) break;
      if (i === 99) throw new Error('the condition did not turn True after lowering minNumberOfCopies');
      await new Promise((r) => setTimeout(r, 300));
    }
    expect((await bictl(['image', 'get', 'short'])).stdout).not.toContain('Warning:');
    expect((await bictl(['image', 'rm', 'short', '--wait', '--timeout', '60s'])).code).toBe(0);
  }, 150_000);

  it('backs up, deletes, restores from the backup and lists nodes', async () => {
    const b = await bictl(['backup', 'create', 'base', '--wait', '--timeout', '60s']);
    expect(b.stderr).toBe('');
    expect(b.stdout).toMatch(/^backup base-[0-9a-f]{8} of base completed\n$/);
    const name = /backup (\S+)/.exec(b.stdout)![1];
    expect((await bictl(['image', 'rm', 'base', '--wait', '--timeout', '60s'])).stdout).toBe('backing image base deleted\n');
    expect((await bictl(['image', 'get', 'base'])).code).toBe(3);
    const r = await bictl(['backup', 'restore', name, '--wait', '--timeout', '60s']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe(`backing image base restored from ${name}\n`);
    const j = JSON.parse((await bictl(['image', 'get', 'base', '-o', 'json'])).stdout);
    expect(j.sourceType).toBe('restore');
    expect(j.currentChecksum).toBe(sha512);
    const nodes = JSON.parse((await bictl(['node', 'ls', '-o', 'json'])).stdout);
    expect(Object.keys(nodes[0].disks)).toHaveLength(3);
  }, 120_000);

  it('node ls shows the real size and available space of each disk (its filesystem, measured by statfs)', async () => {
    const nodes = JSON.parse((await bictl(['node', 'ls', '-o', 'json'])).stdout) as { disks: Record<string, { path: string; storageAvailable: number; storageMaximum: number }> }[];
    const disks = Object.values(nodes[0]!.disks);
    expect(disks).toHaveLength(3);
    for (const d of disks) {
      const fs = await statfs(d.path);
      expect(d.storageMaximum).toBe(fs.blocks * fs.bsize);
      expect(d.storageAvailable).toBeGreaterThan(0);
      expect(d.storageAvailable).toBeLessThanOrEqual(d.storageMaximum);
    }
    const text = await bictl(['node', 'ls']);
    expect(text.code).toBe(0);
    const rows = text.stdout.trim().split('\n').slice(1);
    expect(rows).toHaveLength(3);
    // available space, then the disk's last scrub (none yet: the default interval is 7 days)
    for (const r of rows) expect(r).toMatch(/\s\d+(\.\d+)? (KiB|MiB|GiB|TiB)\s+-$/);
  }, 30_000);

  it('image cleanup of a disk without a copy fails with exit 3 and names the disk', async () => {
    const r = await bictl(['image', 'cleanup', 'base', '--disk', 'no-such-disk-uuid']);
    expect(r.code).toBe(3);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('backing image base has no copy on disk no-such-disk-uuid; its copies are on ');
  }, 30_000);
});
