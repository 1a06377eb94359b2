import { spawn } from 'node:child_process';
import { SourceCancelledError, SourceError } from './errors.js';

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
 * Runs a system tool in its own process group, without a fixed time limit (a big image on a slow disk may take
 * long, longhorn#4471) but cancellable: on abort the whole group is killed. Resolves with stdout+stderr text on
 * exit 0; a missing tool or a non-zero exit becomes a {@link SourceError} naming the command.
 */
export function runTool(cmd: string, args: readonly string[], o: ToolRun): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    if (o.signal?.aborted) {
      reject(new SourceCancelledError(o.signal.reason));
      return;
    }
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
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
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
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
      else reject(new SourceError(`${cmd} ${args.join(' ')} failed (${code === null ? `signal ${sig}` : `exit code ${code}`}): ${output.trim()}`));
    });
  });
}
