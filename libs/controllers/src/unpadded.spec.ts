import { afterEach, describe, expect, it } from '@jest/globals';
import { createHash } from 'node:crypto';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { BackingImageDataSourceKind, BackingImageKind, BackupBackingImageKind, SettingKind, type BackingImage } from './kinds.js';
import { Annotation } from './names.js';
import { NS, startHarness, waitFor, type Harness } from './test-support/harness.js';

const URL = 'http://127.0.0.1:8080/unaligned.raw';
const DATA = 'padded-image-bytes-'.repeat(64);
const UNPADDED = createHash('sha512').update('the image before its zero-padding').digest('hex');

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const readyDisks = (bi: BackingImage) => Object.entries(bi.status?.diskFileStatusMap ?? {}).filter(([, s]) => s.state === 'ready').map(([d]) => d);

describe('an image zero-padded when it was made', () => {
  it('records both checksums (event, log, the unpadded one on the image), and a backup recorded with the unpadded checksum recovers it', async () => {
    h = await startHarness();
    const sum = h.sim.serve(URL, DATA);
    await h.store.create(SettingKind, { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: { name: 'backing-image-recovery-wait-interval', namespace: NS }, value: '0' });
    // the data source reports what a restore of an unaligned backup reports: the padded file, and the image before it
    const dataSourceClient = h.sim.dataSourceClient.bind(h.sim);
    h.sim.dataSourceClient = (address) => {
      const c = dataSourceClient(address);
      return { get: async () => ({ ...(await c.get()), unpaddedSize: DATA.length - 3, unpaddedChecksum: UNPADDED }) };
    };
    await h.cm.actions.create({ name: 'pad', sourceType: 'download', parameters: { url: URL }, expectedChecksum: sum, minNumberOfCopies: 1 });
    const bi = await waitFor('1 ready copy and the unpadded checksum on the image', async () => {
      const b = await h!.store.get(BackingImageKind, 'pad', NS);
      return readyDisks(b).length === 1 && b.metadata.annotations?.[Annotation.UnpaddedChecksum] ? b : undefined;
    });
    expect(bi.metadata.annotations?.[Annotation.UnpaddedChecksum]).toBe(UNPADDED);
    expect(bi.status?.checksum).toBe(sum);
    const text = `restored image was ${DATA.length - 3} bytes (SHA-512 ${UNPADDED}), zero-padded to ${DATA.length} bytes (SHA-512 ${sum})`;
    expect((await h.cm.events.list({ name: 'pad' })).some((e) => e.message === text)).toBe(true);
    expect(h.logs.some((l) => l.includes(`backing image pad: ${text}`))).toBe(true);

    // a completed backup of the image as it was before the padding (what Longhorn recorded for it)
    const url = 'vfs:///backups?backingImage=pad';
    const bbi = await h.store.create(BackupBackingImageKind, {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupBackingImage',
      metadata: { name: 'pad-original', namespace: NS },
      spec: { backingImage: 'pad', backupTargetName: 'default', userCreated: false, labels: {}, syncRequestedAt: '' },
    });
    await h.store.updateStatus(BackupBackingImageKind, { ...bbi, status: { ownerID: 'node-1', state: 'Completed', url, checksum: UNPADDED, size: DATA.length - 3, backupCreatedAt: '2026-01-01T00:00:00Z' } });

    // every copy fails: the image is restored from that backup, not downloaded again
    const disk = readyDisks(bi)[0]!;
    const m = [...h.sim.managers.values()].find((x) => x.diskUUID === disk)!;
    Object.assign(m.files.get('pad')!, { state: 'failed', message: 'file vanished' });
    h.sim.disks.get(disk)!.clear();
    for (const w of m.watchers) w();
    const bids = await waitFor('the first file prepared again from the backup', async () => {
      const d = await h!.store.get(BackingImageDataSourceKind, 'pad', NS);
      return d.spec?.sourceType === 'restore' ? d : undefined;
    }, 15_000);
    expect(bids.spec?.parameters?.['backup-url']).toBe(url);
    // the restore is checked against the image's (padded) checksum, which the restore of the unaligned backup gives
    expect(bids.spec?.checksum).toBe(sum);
    expect(h.sim.downloads.get(URL)).toBe(1);
  });
});
