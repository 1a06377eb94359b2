import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EmbeddedDatastore } from './embedded-store.js';

const startTimeOf = (pid: number): string => {
  const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return text.slice(text.lastIndexOf(')') + 2).split(' ')[19]!;
};
const stateOf = (pid: number): string | undefined => {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ').pop()!.split(' ')[0];
  } catch {
    return undefined;
  }
};

async function until(what: string, fn: () => boolean, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('EmbeddedDatastore directory lock', () => {
  let dir: string;
  const children: ChildProcess[] = [];
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-lock-'));
  });
  afterEach(async () => {
    for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('records pid and start time, and refuses a second open in the same process', async () => {
    const s = await EmbeddedDatastore.open({ dataDir: dir });
    try {
      expect(await fsp.readFile(path.join(dir, 'LOCK'), 'utf8')).toBe(`${process.pid}\n${startTimeOf(process.pid)}\n`);
      await expect(EmbeddedDatastore.open({ dataDir: dir })).rejects.toThrow(/already open in this process/);
    } finally {
      await s.close();
    }
  });

  it('takes over the lock of a zombie holder (a crashed owner its parent has not reaped yet)', async () => {
    // `sleep 2` (long enough for sh to exec first, so sh never reaps it) ends but stays a zombie: its parent (exec'd into `sleep 30`) never waits for it.
    const holder = spawn('sh', ['-c', 'sleep 2 & echo $!; exec sleep 30'], { stdio: ['ignore', 'pipe', 'ignore'] });
    children.push(holder);
    const zombie = await new Promise<number>((r) => holder.stdout!.once('data', (d: Buffer) => r(Number(String(d).trim()))));
    await until('the holder to be a zombie', () => stateOf(zombie) === 'Z');
    await fsp.writeFile(path.join(dir, 'LOCK'), `${zombie}\n${startTimeOf(zombie)}\n`);
    const s = await EmbeddedDatastore.open({ dataDir: dir, lockWaitMs: 60_000 });
    expect(stateOf(zombie)).toBe('Z'); // it did not wait for the zombie to be reaped
    await s.close();
  });

  it('takes over a lock whose pid now names another process (pid reuse), and an old pid-only lock of a dead process', async () => {
    await fsp.writeFile(path.join(dir, 'LOCK'), `1\n${Number(startTimeOf(1)) + 5}\n`);
    await (await EmbeddedDatastore.open({ dataDir: dir, lockWaitMs: 60_000 })).close();
    await fsp.writeFile(path.join(dir, 'LOCK'), String(0x3ffffff));
    await (await EmbeddedDatastore.open({ dataDir: dir, lockWaitMs: 60_000 })).close();
  });

  it('waits for a running holder to exit, then opens', async () => {
    const holder = spawn('sleep', ['30'], { stdio: 'ignore' });
    children.push(holder);
    await until('the holder to run', () => stateOf(holder.pid!) !== undefined);
    await fsp.writeFile(path.join(dir, 'LOCK'), `${holder.pid}\n${startTimeOf(holder.pid!)}\n`);
    let opened = false;
    const opening = EmbeddedDatastore.open({ dataDir: dir, lockWaitMs: 60_000 }).then((s) => {
      opened = true;
      return s;
    });
    await new Promise((r) => setTimeout(r, 300));
    expect(opened).toBe(false); // the holder still runs
    holder.kill('SIGKILL');
    const s = await opening;
    expect(await fsp.readFile(path.join(dir, 'LOCK'), 'utf8')).toContain(`${process.pid}\n`);
    await s.close();
  });

  it('fails with a clear error when a running holder keeps the lock past the wait', async () => {
    const holder = spawn('sleep', ['30'], { stdio: 'ignore' });
    children.push(holder);
    await until('the holder to run', () => stateOf(holder.pid!) !== undefined);
    await fsp.writeFile(path.join(dir, 'LOCK'), `${holder.pid}\n${startTimeOf(holder.pid!)}\n`);
    await expect(EmbeddedDatastore.open({ dataDir: dir, lockWaitMs: 200 })).rejects.toThrow(
      new RegExp(`datastore directory ${dir} is in use by process ${holder.pid} \\(still running after waiting 200 ms for it to exit\\)`),
    );
    // The holder's lock is left as it was.
    expect(await fsp.readFile(path.join(dir, 'LOCK'), 'utf8')).toBe(`${holder.pid}\n${startTimeOf(holder.pid!)}\n`);
  });
});
