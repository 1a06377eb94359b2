import { rm } from 'node:fs/promises';
import { produceBeside } from './no-follow.js';
import { runTool } from './tool-process.js';

export interface Qcow2ConversionRequest {
  /** Raw image to convert. */
  source: string;
  /** qcow2 file to create (removed again when the conversion fails or is cancelled). */
  dest: string;
  signal: AbortSignal;
  /** Percent done (0–100), from `qemu-img convert -p`. */
  onProgress?: (percent: number) => void;
}

/**
 * Converts a raw image to qcow2 with `qemu-img convert -f raw -O qcow2` (Debian package qemu-utils). There is no
 * fixed time limit (Longhorn kills every qemu-img call after 1 minute, longhorn#4471); the conversion is cancelled
 * through the signal instead, and its progress is reported.
 */
export async function convertRawToQcow2(req: Qcow2ConversionRequest): Promise<void> {
  let pending = '';
  try {
    // qemu-img creates its output by name: it writes into a private directory, and the result is renamed to dest
    await produceBeside(req.dest, (out) => runTool('qemu-img', ['convert', '-p', '-f', 'raw', '-O', 'qcow2', req.source, out], {
      packageName: 'qemu-utils',
      signal: req.signal,
      onStdout: (s) => {
        pending += s;
        const parts = pending.split(/[\r\n]/);
        pending = parts.pop() ?? '';
        for (const p of parts) {
          const m = /\((\d+(?:\.\d+)?)\/100%\)/.exec(p);
          if (m) req.onProgress?.(Number(m[1]));
        }
      },
    }).then(() => undefined));
    req.onProgress?.(100);
  } catch (e) {
    await rm(req.dest, { force: true });
    throw e;
  }
}
