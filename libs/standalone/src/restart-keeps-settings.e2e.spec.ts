import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { BackupTargetKind, SettingKind } from '@bis/controllers';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, tempDir } from './test-support/e2e.js';

const MIN_COPIES = 'default-min-number-of-backing-image-copies';

let tmp: { dir: string; remove(): Promise<void> };
let sys: StandaloneHandle | undefined;

beforeAll(async () => {
  if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
  tmp = await tempDir('bis-standalone-defaults-');
});
afterEach(async () => {
  await sys?.stop();
  sys = undefined;
});
afterAll(async () => {
  await tmp?.remove();
});

const start = (dataDir: string, disks: number) =>
  startStandalone({ dataDir: path.join(tmp.dir, dataDir), listen: '127.0.0.1:0', disks, binaries: BINARIES, controllerOptions: { resyncMs: 2000 } });

const setting = async (name: string) => (await sys!.store.get(SettingKind, name, sys!.namespace)).value;

describe('standalone defaults and what a restart keeps', () => {
  it.each([
    [1, '1'],
    [2, '2'],
    [4, '3'],
  ])('with --disks %i the default minimum number of copies is min(3, disks) = %s', async (disks, expected) => {
    sys = await start(`disks-${disks}`, disks);
    expect(await setting(MIN_COPIES)).toBe(expected);
  }, 60_000);

  it("a restart keeps the user's backup target (URL, credential secret, poll interval) and the user's minimum number of copies", async () => {
    sys = await start('restart', 2);
    const ns = sys.namespace;
    const t = await sys.store.get(BackupTargetKind, 'default', ns);
    expect(t.spec?.backupTargetURL).toBe(`vfs://${path.join(tmp.dir, 'restart', 'backups')}`);
    const userURL = `vfs://${path.join(tmp.dir, 'elsewhere')}`;
    await sys.store.update(BackupTargetKind, { ...t, spec: { backupTargetURL: userURL, credentialSecret: 's3-secret', pollInterval: '17s' } });
    const s = await sys.store.get(SettingKind, MIN_COPIES, ns);
    await sys.store.update(SettingKind, { ...s, value: '1' });
    await sys.stop();
    sys = await start('restart', 2);
    const after = await sys.store.get(BackupTargetKind, 'default', ns);
    expect(after.spec).toEqual({ backupTargetURL: userURL, credentialSecret: 's3-secret', pollInterval: '17s' });
    expect(await setting(MIN_COPIES)).toBe('1');
  }, 90_000);
});
