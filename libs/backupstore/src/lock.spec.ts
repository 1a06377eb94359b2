import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { decodeLockFile, encodeLockFile, type LockOwner } from './config.js';
import { FileSystemDriver } from './drivers/filesystem.js';
import { BACKUP_LOCK, BackupStoreLock, currentLockOwner, DELETION_LOCK, isLockOwnerDead, LONGHORN_LOCK_TIMING, withLock, type LockTiming } from './lock.js';
import { BackupStoreError, lockDir } from './names.js';

/** Longhorn's durations and refresh, without the 2 s check wait (the clock is injected where time matters). */
const TIMING: LockTiming = { ...LONGHORN_LOCK_TIMING, checkWaitMs: 0 };
/** Captured from Longhorn while a backup was running (reference §3.3). */
const LONGHORN_LOCK = '{"Name":"lock-02c4b286ef6a4386","Type":1,"Acquired":true}';

async function until(what: string, fn: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('backupstore locks: owner, heartbeat, stale and dead holders', () => {
  let root: string;
  let driver: FileSystemDriver;
  let logs: string[];
  const lockPath = (name: string) => path.join(root, lockDir(), `${name}.lck`);
  const plant = async (name: string, text: string) => {
    await fs.mkdir(path.join(root, lockDir()), { recursive: true });
    await fs.writeFile(lockPath(name), text);
  };
  const exists = (name: string) => fs.access(lockPath(name)).then(() => true, () => false);
  const deleteUnderLock = (now?: () => number) =>
    withLock(driver, DELETION_LOCK, 'backup delete', TIMING, undefined, async () => 'deleted', { now, log: (m) => logs.push(m) });

  beforeEach(async () => {
    root = await fs.mkdtemp(path.join(os.tmpdir(), 'bis-bslock-'));
    driver = new FileSystemDriver(root, `vfs://${root}`);
    logs = [];
  });
  afterEach(async () => {
    await fs.rm(root, { recursive: true, force: true });
  });

  it("reads Longhorn's lock file and writes its three fields first, then this process as owner", async () => {
    expect(decodeLockFile(LONGHORN_LOCK, 'x')).toEqual({ name: 'lock-02c4b286ef6a4386', type: 1, acquired: true });
    expect(encodeLockFile({ name: 'lock-02c4b286ef6a4386', type: 1, acquired: true })).toBe(LONGHORN_LOCK);

    const lock = new BackupStoreLock(driver, BACKUP_LOCK, TIMING);
    await lock.acquire('backup create');
    try {
      const text = await fs.readFile(lockPath(lock.name), 'utf8');
      expect(text.startsWith(`{"Name":"${lock.name}","Type":1,"Acquired":true,"Owner":{`)).toBe(true);
      const doc = JSON.parse(text) as Record<string, unknown>;
      expect(Object.keys(doc)).toEqual(['Name', 'Type', 'Acquired', 'Owner']);
      const owner = decodeLockFile(text, 'x').owner!;
      expect(owner).toEqual(currentLockOwner());
      expect(owner).toMatchObject({ host: os.hostname(), pid: process.pid });
      expect(isLockOwnerDead(owner)).toBe(false);
    } finally {
      await lock.release();
    }
    expect(await exists(lock.name)).toBe(false);
  });

  it("respects a live Longhorn lock (fresh heartbeat), and breaks it once the heartbeat is older than Longhorn's 150 s", async () => {
    await plant('lock-02c4b286ef6a4386', LONGHORN_LOCK);
    const err = await deleteUnderLock().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BackupStoreError);
    expect((err as BackupStoreError).code).toBe('LockConflict');
    expect((err as Error).message).toMatch(/failed to acquire lock .* when performing backup delete, please try again later \(held by lock-02c4b286ef6a4386.lck, type 1, an owner it does not name, heartbeat \d+ s ago\)/);
    expect(await exists('lock-02c4b286ef6a4386')).toBe(true);

    // 149 s later the heartbeat is still within 150 s: respected.
    const mtime = (await fs.stat(lockPath('lock-02c4b286ef6a4386'))).mtimeMs;
    await expect(deleteUnderLock(() => mtime + 149_000)).rejects.toThrow(/please try again later/);
    // 151 s later it is stale: broken, and the operation runs.
    await expect(deleteUnderLock(() => mtime + 151_000)).resolves.toBe('deleted');
    expect(await exists('lock-02c4b286ef6a4386')).toBe(false);
    expect(logs.join('\n')).toMatch(/broke lock .*lock-02c4b286ef6a4386\.lck: its heartbeat is 15\d s old \(stale after 150 s\)/);
  });

  it('breaks at once, whatever its heartbeat, a lock whose owner was a process of this machine that is gone', async () => {
    const child = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1e6)'], { stdio: 'ignore' });
    await until('the child to run', async () => fs.access(`/proc/${child.pid}/stat`).then(() => true, () => false));
    const stat = await fs.readFile(`/proc/${child.pid}/stat`, 'utf8');
    const owner: LockOwner = { ...currentLockOwner()!, pid: child.pid!, startTime: stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]! };
    await plant('lock-00000000000000aa', encodeLockFile({ name: 'lock-00000000000000aa', type: BACKUP_LOCK, acquired: true, owner }));

    // While the writer runs, its lock holds.
    await expect(deleteUnderLock()).rejects.toThrow(new RegExp(`held by lock-00000000000000aa.lck, type 1, process ${child.pid} on `));
    // The writer dies (kill -9): the next delete breaks its lock and proceeds, with no wait for the heartbeat.
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await exited;
    expect(isLockOwnerDead(owner)).toBe(true);
    await expect(deleteUnderLock()).resolves.toBe('deleted');
    expect(await exists('lock-00000000000000aa')).toBe(false);
    expect(logs.join('\n')).toContain(`its owner, process ${child.pid} on ${owner.host}, no longer runs`);
  });

  it('never judges an owner of another machine, boot or pid namespace dead: only its heartbeat counts', async () => {
    const self = currentLockOwner()!;
    const gone = 0x3ffffff; // no such pid here
    for (const owner of [
      { ...self, host: `${self.host}-other`, pid: gone },
      { ...self, bootID: '00000000-0000-0000-0000-000000000000', pid: gone },
      { ...self, pidNS: 'pid:[1]', pid: gone },
    ]) {
      expect(isLockOwnerDead(owner, self)).toBe(false);
      await plant('lock-00000000000000bb', encodeLockFile({ name: 'lock-00000000000000bb', type: BACKUP_LOCK, acquired: true, owner }));
      await expect(deleteUnderLock()).rejects.toThrow(/please try again later/);
    }
    expect(isLockOwnerDead({ ...self, pid: gone }, self)).toBe(true);
    expect(isLockOwnerDead({ ...self, startTime: `${self.startTime}0` }, self)).toBe(true); // this pid, reused
  });

  it('refreshes the heartbeat while held, so a long operation is never taken for stale', async () => {
    const fast: LockTiming = { durationMs: 1_000, refreshMs: 50, checkWaitMs: 0 };
    const lock = new BackupStoreLock(driver, BACKUP_LOCK, fast);
    await lock.acquire('backup create');
    try {
      const first = (await fs.stat(lockPath(lock.name))).mtimeMs;
      await until('a refresh', async () => (await fs.stat(lockPath(lock.name))).mtimeMs > first);
      const refreshed = (await fs.stat(lockPath(lock.name))).mtimeMs;
      // Judged at the time of the last heartbeat + 0.9 × the duration: live.
      await expect(
        withLock(driver, DELETION_LOCK, 'backup delete', fast, undefined, async () => 'deleted', { now: () => refreshed + 900 }),
      ).rejects.toThrow(/please try again later/);
      expect(await exists(lock.name)).toBe(true);
    } finally {
      await lock.release();
    }
  });

  it('keeps removing its lock file after a release that failed (target unreachable), until it is gone', async () => {
    const lock = new BackupStoreLock(driver, BACKUP_LOCK, { durationMs: 60_000, refreshMs: 50, checkWaitMs: 0 }, { log: (m) => logs.push(m) });
    await lock.acquire('backup create');
    const remove = driver.remove.bind(driver);
    let failures = 2;
    driver.remove = async (p, signal) => {
      if (failures > 0) {
        failures--;
        throw new BackupStoreError('Io', 'target unreachable');
      }
      return remove(p, signal);
    };
    await expect(lock.release()).rejects.toThrow(/target unreachable/);
    expect(await exists(lock.name)).toBe(true);
    await until('the lock file to be removed and that logged', async () => !(await exists(lock.name)) && logs.some((l) => l.includes('after a failed release')));
    expect(failures).toBe(0);
  });
});
