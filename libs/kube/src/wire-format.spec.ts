import { describe, expect, it } from '@jest/globals';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { WireFormat } from './wire-format.js';

const wire = new WireFormat();
const meta = { name: 'x', namespace: 'longhorn-system', annotations: { a: '' }, labels: { 'longhorn.io/node': '' } };

describe('WireFormat (omitempty for the Longhorn kinds)', () => {
  it('omits empty optional strings at every depth: conditions in arrays, objects in maps, nested objects', () => {
    const node = {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'Node',
      metadata: meta,
      spec: { name: 'node-1', disks: { d: { path: '/data', diskType: 'filesystem', diskDriver: '', allowScheduling: true, storageReserved: 0, tags: [''] } } },
      status: {
        conditions: [{ type: 'Ready', status: 'True', reason: '', message: '', lastProbeTime: '', lastTransitionTime: '2024-01-01T00:00:00Z' }],
        diskStatus: { d: { diskUUID: 'u', diskDriver: '', conditions: [{ type: 'Ready', status: 'True', reason: '', message: '' }], storageMaximum: 0 } },
        region: '',
        zone: '',
        autoEvicting: false,
      },
    };
    const out = wire.toWire(node);
    expect(out).toEqual({
      apiVersion: LONGHORN_API_VERSION,
      kind: 'Node',
      metadata: meta, // metadata is the API server's, untouched (empty label values are data)
      spec: { name: 'node-1', disks: { d: { path: '/data', diskType: 'filesystem', allowScheduling: true, storageReserved: 0, tags: [''] } } },
      status: {
        conditions: [{ type: 'Ready', status: 'True', lastTransitionTime: '2024-01-01T00:00:00Z' }],
        diskStatus: { d: { diskUUID: 'u', conditions: [{ type: 'Ready', status: 'True' }], storageMaximum: 0 } },
        autoEvicting: false,
      },
    });
    // The input is not modified.
    expect(node.status.region).toBe('');
    expect(node.spec.disks.d.diskDriver).toBe('');
  });

  it('never drops a required property, map values or array items, even when empty', () => {
    const setting = { apiVersion: LONGHORN_API_VERSION, kind: 'Setting', metadata: meta, value: '' };
    expect(wire.toWire(setting)).toEqual(setting);
    const bbi = {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackupBackingImage',
      metadata: meta,
      spec: { backingImage: '', userCreated: false, labels: { k: '' } },
      status: { error: '', url: '', state: '' },
    };
    expect(wire.toWire(bbi)).toEqual({ ...bbi, status: {} });
    const bi = { apiVersion: LONGHORN_API_VERSION, kind: 'BackingImage', metadata: meta, spec: { sourceType: 'download', sourceParameters: { url: '' }, checksum: '' } };
    expect(wire.toWire(bi)).toEqual({ ...bi, spec: { sourceType: 'download', sourceParameters: { url: '' } } });
  });

  it('reads an absent optional string as empty, as a Go struct field; nullable strings stay absent', () => {
    const bbi = { apiVersion: LONGHORN_API_VERSION, kind: 'BackupBackingImage', metadata: meta, spec: { backingImage: 'bi', userCreated: true }, status: { size: 3 } };
    const got = wire.fromWire(bbi) as unknown as { spec: Record<string, unknown>; status: Record<string, unknown> };
    expect(got.status).toMatchObject({ size: 3, url: '', error: '', state: '', checksum: '', backingImage: '', secret: '' });
    expect('lastSyncedAt' in got.status).toBe(false); // nullable date-time
    expect('backupTargetName' in got.spec).toBe(false); // nullable string
    expect('syncRequestedAt' in got.spec).toBe(false);
    // Objects absent from the answer are not invented.
    const bim = wire.fromWire({ apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageManager', metadata: meta, spec: { image: 'i' } }) as unknown as Record<string, unknown>;
    expect(bim['status']).toBeUndefined();
    expect(bim['spec']).toEqual({ image: 'i', nodeID: '', diskUUID: '', diskPath: '' });
  });

  it('round-trips what a controller writes: toWire then fromWire gives the same object', () => {
    const bim = {
      apiVersion: LONGHORN_API_VERSION,
      kind: 'BackingImageManager',
      metadata: meta,
      spec: { image: 'img', nodeID: 'n', diskUUID: 'd', diskPath: '/p', backingImages: { bi: '' } },
      status: {
        ownerID: 'n',
        currentState: 'starting',
        ip: '',
        storageIP: '',
        message: '',
        apiVersion: 0,
        apiMinVersion: 0,
        backingImageFileMap: { bi: { name: 'bi', uuid: 'u', state: '', message: '', currentChecksum: '', senderManagerAddress: '', size: 0, virtualSize: 0, realSize: 0, sendingReference: 0, progress: 0, nextRetryAt: '' } },
        diskScrub: { lastScrubTime: '', lastScrubResult: '', lastScrubMessage: '', lastScrubFiles: 0, scrubbing: '' },
      },
    };
    const sent = wire.toWire(bim);
    const empties: string[] = [];
    const walk = (v: unknown, at: string): void => {
      if (v === '') empties.push(at);
      else if (v && typeof v === 'object') for (const [k, x] of Object.entries(v)) walk(x, `${at}.${k}`);
    };
    walk({ spec: sent.spec, status: sent.status }, '');
    expect(empties).toEqual(['.spec.backingImages.bi']); // a map value is data: kept
    expect(sent.status).toEqual({
      ownerID: 'n',
      currentState: 'starting',
      apiVersion: 0,
      apiMinVersion: 0,
      backingImageFileMap: { bi: { name: 'bi', uuid: 'u', size: 0, virtualSize: 0, realSize: 0, sendingReference: 0, progress: 0 } },
      diskScrub: { lastScrubFiles: 0 },
    });
    expect(wire.fromWire(sent)).toEqual(bim);
  });

  it('leaves other kinds alone, and objects whose kind it does not know', () => {
    const w = { apiVersion: 'contract.bis.dev/v1', kind: 'Widget', metadata: meta, spec: { a: '' } };
    expect(wire.toWire(w)).toBe(w);
    expect(wire.fromWire(w)).toBe(w);
    expect(wire.knows({ apiVersion: LONGHORN_API_VERSION, kind: 'BackingImage' })).toBe(true);
    expect(wire.knows({ apiVersion: 'v1', kind: 'Pod' })).toBe(false);
  });
});
