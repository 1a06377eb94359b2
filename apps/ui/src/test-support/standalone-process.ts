import { join, resolve } from 'node:path';
import { startStandaloneProcess as startSystem, type StandaloneProcess } from '@bis/standalone/testing';

export type { StandaloneProcess };

/** The built web UI (the `ui:build` target writes it): apps/ui/src/test-support → ../../dist. */
export const UI_DIST = join(resolve(import.meta.dirname, '../..'), 'dist');

/** The real standalone system serving this web UI (see `@bis/standalone/testing`). */
export function startStandaloneProcess(opts: { disks?: number; allowSourceHosts?: string; uiDir?: string; extraArgs?: readonly string[] } = {}): Promise<StandaloneProcess> {
  return startSystem({ ...opts, uiDir: opts.uiDir ?? UI_DIST });
}
