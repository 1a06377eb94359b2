import { describe, expect, it } from '@jest/globals';
import type { BackingImageFileInfo } from '@bis/crd-types';
import { ImageAttention } from './image-attention.js';
import type { BackingImageManager } from './kinds.js';

const file = (state: BackingImageFileInfo['state'], progress = 0): BackingImageFileInfo => ({ name: 'x', uuid: 'u', state, progress });

function manager(backingImages: Record<string, string>, files: Record<string, BackingImageFileInfo>, spec: Partial<NonNullable<BackingImageManager['spec']>> = {}): BackingImageManager {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackingImageManager',
    metadata: { name: 'bim-1', namespace: 'longhorn-system' },
    spec: { nodeID: 'node-1', diskUUID: 'disk-1', diskPath: '/data', image: 'bim:1', backingImages, ...spec },
    status: { backingImageFileMap: files },
  };
}

const names = (look: 'all' | ReadonlySet<string>) => (look === 'all' ? 'all' : [...look].sort());

describe('ImageAttention', () => {
  it('a manager never seen is looked at whole once; then only what was marked, each mark once', () => {
    const a = new ImageAttention();
    expect(a.take('bim-1')).toBe('all');
    expect(names(a.take('bim-1'))).toEqual([]);
    a.mark('bim-1', 'img-2');
    a.mark('bim-1', 'img-1');
    a.mark('bim-1', 'img-2');
    a.mark('bim-2', 'img-9');
    expect(names(a.take('bim-1'))).toEqual(['img-1', 'img-2']);
    expect(names(a.take('bim-1'))).toEqual([]);
    expect(a.take('bim-2')).toBe('all'); // never taken before: whole, whatever was marked
  });

  it('all() wins over marks until the next take; forget() makes the next pass whole again', () => {
    const a = new ImageAttention();
    a.take('bim-1');
    a.mark('bim-1', 'img-1');
    a.all('bim-1');
    for (const image of ['img-2', 'img-3']) a.mark('bim-1', image);
    expect(a.take('bim-1')).toBe('all');
    for (const image of ['img-2', 'img-3']) a.mark('bim-1', image);
    expect(names(a.take('bim-1'))).toEqual(['img-2', 'img-3']);
    a.forget('bim-1');
    expect(a.take('bim-1')).toBe('all');
  });

  it("marks the images whose spec entry or file entry changed between two versions, not the others", () => {
    const a = new ImageAttention();
    a.take('bim-1');
    const ready = file('ready', 100);
    const old = manager(
      { 'img-1': 'u1', 'img-2': 'u2', 'img-3': 'u3', 'img-4': 'u4', 'img-7': 'u7' },
      { 'img-1': ready, 'img-2': file('in-progress', 10), 'img-3': file('ready', 100), 'img-4': file('pending'), 'img-7': file('ready', 100) },
    );
    const cur = manager(
      // img-3 left the spec, img-5 joined, img-4 got another UUID
      { 'img-1': 'u1', 'img-2': 'u2', 'img-4': 'u4b', 'img-5': 'u5', 'img-7': 'u7' },
      // img-1 the same object, img-7 an equal copy (neither is a change); img-2 progressed; img-4's file gone; img-6 new
      { 'img-1': ready, 'img-2': file('in-progress', 20), 'img-3': file('ready', 100), 'img-6': file('failed'), 'img-7': file('ready', 100) },
    );
    a.markChanges(old, cur);
    expect(names(a.take('bim-1'))).toEqual(['img-2', 'img-3', 'img-4', 'img-5', 'img-6']);
    // a write that kept both maps (shared between the versions) marks nothing
    a.markChanges(cur, { ...cur, metadata: { ...cur.metadata, annotations: { a: 'b' } } });
    expect(names(a.take('bim-1'))).toEqual([]);
  });

  it('images waiting for a slot are kept apart until a pass takes them; a whole pass or forget() drops them', () => {
    const a = new ImageAttention();
    a.take('bim-1');
    a.waitForSlot('bim-1', 'img-1');
    a.waitForSlot('bim-1', 'img-2');
    a.waitForSlot('bim-1', 'img-1');
    expect(a.slotWaiters('bim-1')).toBe(2);
    // not part of the marks: a pass that has no slot to give does not look at them
    expect(names(a.take('bim-1'))).toEqual([]);
    expect([...a.takeSlotWaiters('bim-1')].sort()).toEqual(['img-1', 'img-2']);
    expect(a.slotWaiters('bim-1')).toBe(0);
    a.waitForSlot('bim-1', 'img-3');
    a.all('bim-1');
    expect(a.take('bim-1')).toBe('all');
    expect(a.slotWaiters('bim-1')).toBe(0);
    a.waitForSlot('bim-1', 'img-4');
    a.forget('bim-1');
    expect(a.slotWaiters('bim-1')).toBe(0);
  });

  it('a change of the node, disk, path or image of a manager makes its next pass whole', () => {
    for (const change of [{ nodeID: 'node-2' }, { diskUUID: 'disk-2' }, { diskPath: '/other' }, { image: 'bim:2' }]) {
      const a = new ImageAttention();
      a.take('bim-1');
      const files = { 'img-1': file('ready', 100) };
      a.markChanges(manager({ 'img-1': 'u1' }, files), manager({ 'img-1': 'u1' }, files, change));
      expect(a.take('bim-1')).toBe('all');
    }
  });
});
