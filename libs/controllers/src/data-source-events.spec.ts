import { describe, expect, it } from '@jest/globals';
import type { Stored } from '@bis/datastore';
import { imageChangeConcernsDataSource } from './data-source-controller.js';
import type { BackingImage } from './kinds.js';

const image = (over: Partial<BackingImage> = {}, meta: Partial<Stored<BackingImage>['metadata']> = {}): Stored<BackingImage> =>
  ({
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackingImage',
    metadata: { name: 'img', namespace: 'longhorn-system', uid: 'u', resourceVersion: '1', generation: 1, creationTimestamp: '2026-01-01T00:00:00Z', ...meta },
    spec: { sourceType: 'download', sourceParameters: { url: 'http://h/x' }, diskFileSpecMap: { 'disk-1': { dataEngine: 'v1', evictionRequested: false } } },
    status: { uuid: 'abc', diskFileStatusMap: { 'disk-1': { state: 'in-progress', progress: 10 } } },
    ...over,
  }) as Stored<BackingImage>;

describe('which image changes reach its data source', () => {
  it('a status-only change and a resync do not; a spec change, a deletion, an add and a delete do', () => {
    const before = image();
    const statusOnly = image({ status: { ...before.status, diskFileStatusMap: { 'disk-1': { state: 'ready', progress: 100 } }, diskLastRefAtMap: { 'disk-1': 'now' } } }, { resourceVersion: '2' });
    expect(imageChangeConcernsDataSource('MODIFIED', statusOnly, before)).toBe(false);
    // an equal spec in a fresh object (a Kubernetes watch decodes every version anew) is no change either
    expect(imageChangeConcernsDataSource('MODIFIED', image({ spec: structuredClone(before.spec) }, { resourceVersion: '3' }), before)).toBe(false);
    const newDisk = image({ spec: { ...before.spec, diskFileSpecMap: { ...before.spec?.diskFileSpecMap, 'disk-2': { dataEngine: 'v1', evictionRequested: false } } } });
    expect(imageChangeConcernsDataSource('MODIFIED', newDisk, before)).toBe(true);
    expect(imageChangeConcernsDataSource('MODIFIED', image({}, { deletionTimestamp: '2026-01-02T00:00:00Z' }), before)).toBe(true);
    for (const t of ['ADDED', 'DELETED']) expect(imageChangeConcernsDataSource(t, before, undefined)).toBe(true);
    expect(imageChangeConcernsDataSource('RESYNC', before, before)).toBe(false);
    expect(imageChangeConcernsDataSource('MODIFIED', statusOnly, undefined)).toBe(true);
  });
});
