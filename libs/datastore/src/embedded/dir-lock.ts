import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import path from 'node:path';
import { fsyncDir } from './log-file.js';

/** Removes the directory's `LOCK` (at close, or when an open fails after taking it). */
export async function releaseLock(dir: string): Promise<void> {
  await fsp.rm(path.join(dir, 'LOCK'), { force: true });
}

/**
 * One process per data directory: a `LOCK` file with the owner's pid and start time (`/proc/<pid>/stat`, so that a
 * reused pid is not mistaken for the owner). A lock whose owner is gone — no such process, a zombie, or another
 * process under that pid — is taken over. While the owner still runs (e.g. a restart right after a crash whose
 * process the parent has not reaped yet, or one still shutting down) this waits up to `waitMs` for it to go away.
 */
export async function acquireLock(dir: string, waitMs: number): Promise<void> {
  const lock = path.join(dir, 'LOCK');
  const deadline = Date.now() + waitMs;
  for (;;) {
    try {
      const me = procStat(process.pid);
      await fsp.writeFile(lock, `${process.pid}\n${me?.startTime ?? ''}\n`, { flag: 'wx' });
      await fsyncDir(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      const [pidText = '', startTime = ''] = (await fsp.readFile(lock, 'utf8').catch(() => '')).split('\n').map((l) => l.trim());
      const pid = Number(pidText);
      if (pid === process.pid) throw new Error(`datastore directory ${dir} is already open in this process`);
      if (pid > 0 && ownerRunning(pid, startTime)) {
        if (Date.now() >= deadline) {
          throw new Error(`datastore directory ${dir} is in use by process ${pid} (still running after waiting ${waitMs} ms for it to exit)`);
        }
        await new Promise((r) => setTimeout(r, 50));
        continue;
      }
      await fsp.rm(lock, { force: true });
    }
  }
}

/** State and start time of a process from `/proc/<pid>/stat` (undefined when there is none or no /proc). */
function procStat(pid: number): { state: string; startTime: string } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return fields[0] && fields[19] ? { state: fields[0], startTime: fields[19] } : undefined;
  } catch {
    return undefined;
  }
}

/** The lock's owner still runs: the process exists, is not a zombie and (when recorded) started when the owner did. */
function ownerRunning(pid: number, startTime: string): boolean {
  const stat = procStat(pid);
  if (stat) return stat.state !== 'Z' && (startTime === '' || stat.startTime === startTime);
  if (existsSync('/proc/self/stat')) return false;
  try {
    process.kill(pid, 0); // no /proc: existence is all that can be told
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
