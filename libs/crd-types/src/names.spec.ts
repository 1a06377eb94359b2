import { createHash } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import { autoCorrectName, backingImageConfigPath, backingImageDataSourceName, backingImageDataSourcePodLabels, backingImageDataSourcePodName, backingImageFilePath, backingImageLabels, backingImageManagerLabels, backingImageManagerName, backupBackingImageLabels, backupBackingImageName, dataSourceTempFilePath, exportAttachmentTicketId, generateBackingImageUUID, replicaBackingImagePath, replicaBackingImageSelector } from './names.js';

describe('BackingImageManager name', () => {
  it('is bim- + 56 hex characters of SHA-224("<image>-<diskUUID>")', () => {
    const name = backingImageManagerName('longhornio/backing-image-manager:v1.8.0', '7b2c1a0e-disk');
    expect(name).toMatch(/^bim-[0-9a-f]{56}$/);
    const expected = createHash('sha224').update('longhornio/backing-image-manager:v1.8.0-7b2c1a0e-disk').digest('hex');
    expect(name).toBe(`bim-${expected}`);
    // a known vector: SHA-224("a-b")
    expect(backingImageManagerName('a', 'b')).toBe('bim-' + createHash('sha224').update('a-b').digest('hex'));
  });

  it('trims the joined string and differs per image and per disk', () => {
    expect(backingImageManagerName(' img', 'disk ')).toBe(backingImageManagerName('img', 'disk'));
    expect(backingImageManagerName('img', 'disk-1')).not.toBe(backingImageManagerName('img', 'disk-2'));
    expect(backingImageManagerName('img:v1', 'disk')).not.toBe(backingImageManagerName('img:v2', 'disk'));
  });
});

describe('other names', () => {
  it('BBI name is <bi>-<8 hex>', () => {
    expect(backupBackingImageName('ubuntu')).toMatch(/^ubuntu-[0-9a-f]{8}$/);
    expect(backupBackingImageName('ubuntu', () => '0a1b2c3d')).toBe('ubuntu-0a1b2c3d');
    expect(backupBackingImageName('x')).not.toBe(backupBackingImageName('x'));
  });

  it('BIDS and its pod', () => {
    expect(backingImageDataSourceName('ubuntu')).toBe('ubuntu');
    expect(backingImageDataSourcePodName('ubuntu')).toBe('backing-image-ds-ubuntu');
    expect(exportAttachmentTicketId('ubuntu')).toBe('bim-ds-controller-ubuntu');
  });

  it('BI uuid is 8 characters of a UUIDv4', () => {
    const uuid = generateBackingImageUUID();
    expect(uuid).toMatch(/^[0-9a-f]{8}$/);
    expect(generateBackingImageUUID()).not.toBe(uuid);
  });

  it('on-disk paths', () => {
    expect(backingImageFilePath('/var/lib/longhorn', 'ubuntu', 'abcdef12')).toBe('/var/lib/longhorn/backing-images/ubuntu-abcdef12/backing');
    expect(backingImageConfigPath('/var/lib/longhorn/', 'ubuntu', 'abcdef12')).toBe('/var/lib/longhorn/backing-images/ubuntu-abcdef12/backing.cfg');
    expect(dataSourceTempFilePath('/var/lib/longhorn', 'ubuntu', 'abcdef12')).toBe('/var/lib/longhorn/tmp/ubuntu-abcdef12');
    expect(replicaBackingImagePath('/var/lib/longhorn', 'ubuntu', 'abcdef12')).toBe('/host/var/lib/longhorn/backing-images/ubuntu-abcdef12/backing');
  });

  it('auto-corrected names: lower case, and at most 40 characters with a SHA-512 suffix', () => {
    expect(autoCorrectName('Ubuntu-2404')).toBe('ubuntu-2404');
    const long = 'A'.repeat(30) + '-' + 'b'.repeat(20);
    const suffix = createHash('sha512').update(long).digest('hex').slice(0, 8);
    expect(autoCorrectName(long)).toBe('a'.repeat(30) + '-' + suffix);
    expect(autoCorrectName(long)).toHaveLength(39); // the cut part's trailing '-' is dropped
    const exactly = 'c'.repeat(45);
    expect(autoCorrectName(exactly)).toHaveLength(40);
    expect(autoCorrectName('d'.repeat(40))).toBe('d'.repeat(40));
  });
});

describe('labels', () => {
  it('use Longhorn keys', () => {
    expect(backingImageLabels()).toEqual({ 'longhorn.io/managed-by': 'longhorn-manager', 'longhorn.io/component': 'backing-image' });
    expect(backingImageManagerLabels('node-1', 'disk-1')).toEqual({
      'longhorn.io/managed-by': 'longhorn-manager',
      'longhorn.io/component': 'backing-image-manager',
      'longhorn.io/disk-uuid': 'disk-1',
      'longhorn.io/node': 'node-1',
    });
    expect(backingImageDataSourcePodLabels('ubuntu', 'node-1', 'disk-1')).toEqual({
      'longhorn.io/managed-by': 'longhorn-manager',
      'longhorn.io/component': 'backing-image-data-source',
      'longhorn.io/backing-image-data-source': 'ubuntu',
      'longhorn.io/disk-uuid': 'disk-1',
      'longhorn.io/node': 'node-1',
    });
    expect(backupBackingImageLabels('default', 'ubuntu')).toEqual({ 'backup-target': 'default', 'backing-image': 'ubuntu' });
    expect(replicaBackingImageSelector('ubuntu', 'disk-1')).toEqual({ 'longhorn.io/backing-image': 'ubuntu', longhorndiskuuid: 'disk-1' });
  });
});
