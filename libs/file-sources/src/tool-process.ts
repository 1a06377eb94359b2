import { spawn } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { SourceCancelledError, SourceError } from './errors.js';

/** util-linux `setpriv`, which can start a program with a parent-death signal (`PR_SET_PDEATHSIG`). */
const SETPRIV = '/usr/bin/setpriv';
let setprivUsable: boolean | undefined;
function hasSetpriv(): boolean {
  if (setprivUsable === undefined) {
    try {
      accessSync(SETPRIV, constants.X_OK);
      setprivUsable = true;
    } catch {
      setprivUsable = false;
    }
  }
  return setprivUsable;
}

export interface ToolRun {
  /** The tool's stdout, as it arrives (e.g. progress lines). */
  onStdout?: (text: string) => void;
  /** Bytes for the tool's stdin (e.g. a passphrase); stdin is closed after them. */
  input?: string | Buffer;
  signal?: AbortSignal;
  /** Debian package to name when the tool is missing. */
  packageName: string;
}

/**
 * Runs a system tool without a fixed time limit (a big image on a slow disk may take long, longhorn#4471) but
 * cancellable: on abort the tool is killed. Resolves with stdout+stderr text on exit 0; a missing tool or a non-zero
 * exit becomes a {@link SourceError} naming the command.
 *
 * The tool never outlives the process that runs it: it stays in this process's group (so the group's SIGTERM, from a
 * clean stop or from the liveness pipe, reaches it), and it is started through `setpriv --pdeathsig KILL` when
 * util-linux's setpriv is there, so the kernel kills it when this process dies, also by `kill -9`.
 */
export function runTool(cmd: string, args: readonly string[], o: ToolRun): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    if (o.signal?.aborted) {
      reject(new SourceCancelledError(o.signal.reason));
      return;
    }
    const viaSetpriv = hasSetpriv();
    const child = viaSetpriv
      ? spawn(SETPRIV, ['--pdeathsig', 'KILL', '--', cmd, ...args], { stdio: ['pipe', 'pipe', 'pipe'] })
      : spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    const keep = (s: string): void => {
      output = (output + s).slice(-4000);
    };
    child.stdout.setEncoding('utf8').on('data', (s: string) => {
      o.onStdout?.(s);
      keep(s);
    });
    child.stderr.setEncoding('utf8').on('data', keep);
    child.stdin.on('error', () => undefined);
    child.stdin.end(o.input ?? '');
    const kill = (): void => {
      child.kill('SIGKILL');
    };
    const onAbort = (): void => kill();
    o.signal?.addEventListener('abort', onAbort, { once: true });
    child.once('error', (e: NodeJS.ErrnoException) => {
      o.signal?.removeEventListener('abort', onAbort);
      reject(
        e.code === 'ENOENT'
          ? new SourceError(`${cmd} is not installed (Debian package ${o.packageName})`)
          : new SourceError(`cannot run ${cmd}: ${e.message}`),
      );
    });
    child.once('close', (code, sig) => {
      o.signal?.removeEventListener('abort', onAbort);
      if (o.signal?.aborted) reject(new SourceCancelledError(o.signal.reason));
      else if (code === 0) resolve(output);
      // setpriv exits 127 when it cannot find the program: the same as spawn's ENOENT without it
      else if (viaSetpriv && code === 127 && output.includes('failed to execute'))
        reject(new SourceError(`${cmd} is not installed (Debian package ${o.packageName})`));
      else reject(new SourceError(`${cmd} ${args.join(' ')} failed (${code === null ? `signal ${sig}` : `exit code ${code}`}): ${output.trim()}`));
    });
  });
}
