import { createHash } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import { applyBackingImageCreateDefaults, applyBackingImageDataSourceDefaults, applyBackingImageManagerDefaults, applyBackingImageUpdateDefaults, applyBackupBackingImageCreateDefaults, applyBackupBackingImageUpdateDefaults, backupTargetNameForBackupUrl, defaultCloneEncryption, defaultDataEngine, defaultDiskMaps, defaultExportType, defaultMinNumberOfCopies, withFinalizer } from './defaults.js';
import { type BackingImage, type BackingImageDataSource, type BackingImageManager, type BackupBackingImage } from './kinds/index.js';
import { fullBackingImage, fullBackupBackingImage } from './test-support/fixtures.js';

function newBi(spec: NonNullable<BackingImage['spec']>, name = 'img'): BackingImage {
  return { apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImage', metadata: { name }, spec };
}
const CTX = { defaultMinNumberOfCopies: 3, backupConcurrentLimit: 2 };

describe('BackingImage create defaults', () => {
  it('download: finalizer, labels, empty maps, min copies from the setting, data engine v1, trimmed input', () => {
    const input = newBi({ sourceType: 'download', checksum: `  ${'AB'.repeat(64)} `, sourceParameters: { url: ' http://x/y.img ' } }, 'My-Image');
    const out = applyBackingImageCreateDefaults(input, CTX);
    expect(out).toEqual({
      apiVersion: 'longhorn.io/v1beta2',
      kind: 'BackingImage',
      metadata: {
        name: 'my-image',
        finalizers: ['longhorn.io'],
        labels: { 'longhorn.io/managed-by': 'longhorn-manager', 'longhorn.io/component': 'backing-image' },
      },
      spec: {
        sourceType: 'download',
        checksum: 'ab'.repeat(64),
        sourceParameters: { url: 'http://x/y.img' },
        disks: {},
        diskFileSpecMap: {},
        minNumberOfCopies: 3,
        dataEngine: 'v1',
      },
    });
    // the input is untouched
    expect(input.metadata).toEqual({ name: 'My-Image' });
  });

  it('keeps explicit values and existing labels', () => {
    const input = newBi({ sourceType: 'upload', minNumberOfCopies: 1, dataEngine: 'v1', diskFileSpecMap: { d: {} } });
    input.metadata.labels = { team: 'a' };
    const out = applyBackingImageCreateDefaults(input, CTX);
    expect(out.spec).toMatchObject({ minNumberOfCopies: 1, diskFileSpecMap: { d: {} }, disks: {} });
    expect(out.metadata.labels).toMatchObject({ team: 'a', 'longhorn.io/component': 'backing-image' });
  });

  it('long names are shortened to 40 characters with a hash suffix', () => {
    const long = 'x'.repeat(50);
    const out = applyBackingImageCreateDefaults(newBi({ sourceType: 'upload' }, long), CTX);
    expect(out.metadata.name).toBe('x'.repeat(31) + '-' + createHash('sha512').update(long).digest('hex').slice(0, 8));
  });

  it('export-from-volume: export-type defaults to raw', () => {
    expect(defaultExportType(newBi({ sourceType: 'export-from-volume', sourceParameters: { 'volume-name': 'v' } })).spec!.sourceParameters)
      .toEqual({ 'volume-name': 'v', 'export-type': 'raw' });
    expect(defaultExportType(newBi({ sourceType: 'export-from-volume', sourceParameters: { 'export-type': 'qcow2' } })).spec!.sourceParameters)
      .toEqual({ 'export-type': 'qcow2' });
    expect(defaultExportType(newBi({ sourceType: 'download', sourceParameters: {} })).spec!.sourceParameters).toEqual({});
  });

  it('clone: encryption ignore copies secret and checksum from the source; encrypt clears the checksum', () => {
    const source = fullBackingImage();
    source.spec!.secret = 's';
    source.spec!.secretNamespace = 'ns';
    expect(defaultCloneEncryption(newBi({ sourceType: 'clone', sourceParameters: { 'backing-image': 'src' } })).spec!.sourceParameters)
      .toEqual({ 'backing-image': 'src', encryption: 'ignore' });
    const out = applyBackingImageCreateDefaults(
      newBi({ sourceType: 'clone', checksum: 'f'.repeat(128), sourceParameters: { 'backing-image': 'src' } }),
      { ...CTX, cloneSource: source },
    );
    expect(out.spec).toMatchObject({ secret: 's', secretNamespace: 'ns', checksum: source.status!.checksum });
    const encrypted = applyBackingImageCreateDefaults(
      newBi({ sourceType: 'clone', checksum: 'f'.repeat(128), sourceParameters: { 'backing-image': 'src', encryption: 'encrypt' } }),
      { ...CTX, cloneSource: fullBackingImage() },
    );
    expect(encrypted.spec!.checksum).toBe('');
  });

  it('clone: errors when the source is unknown or has no checksum yet', () => {
    const bi = newBi({ sourceType: 'clone', sourceParameters: { 'backing-image': 'src' } });
    expect(() => applyBackingImageCreateDefaults(bi, CTX)).toThrow('source backing image src not found');
    const source = fullBackingImage();
    source.status!.checksum = '';
    expect(() => applyBackingImageCreateDefaults(bi, { ...CTX, cloneSource: source })).toThrow(/has no checksum yet/);
  });

  it('restore: concurrent-limit from the setting and backup-target-name from the matching BBI', () => {
    const bbi = fullBackupBackingImage();
    bbi.spec!.backupTargetName = 'remote';
    bbi.status!.url = 's3://bucket@us-east-1/?backingImage=ubuntu&backupName=x';
    const url = 's3://bucket@us-east-1/?backingImage=ubuntu';
    const target = backupTargetNameForBackupUrl(url, [bbi]);
    expect(target).toBe('remote');
    expect(backupTargetNameForBackupUrl('s3://other@us-east-1/?backingImage=ubuntu', [bbi])).toBeUndefined();
    expect(backupTargetNameForBackupUrl('s3://bucket@us-east-1/?backingImage=debian', [bbi])).toBeUndefined();
    expect(backupTargetNameForBackupUrl('http://bucket/?backingImage=ubuntu', [bbi])).toBeUndefined();
    const out = applyBackingImageCreateDefaults(newBi({ sourceType: 'restore', sourceParameters: { 'backup-url': url } }), {
      ...CTX,
      restoreBackupTargetName: target,
    });
    expect(out.spec!.sourceParameters).toEqual({ 'backup-url': url, 'concurrent-limit': '2', 'backup-target-name': 'remote' });
    expect(() => applyBackingImageCreateDefaults(newBi({ sourceType: 'restore', sourceParameters: { 'backup-url': url } }), CTX)).toThrow(
      /cannot find the backup target/,
    );
  });

  it('single-purpose defaulting functions', () => {
    expect(defaultMinNumberOfCopies(newBi({ minNumberOfCopies: 0 }), 5).spec!.minNumberOfCopies).toBe(5);
    expect(defaultMinNumberOfCopies(newBi({})).spec!.minNumberOfCopies).toBe(3);
    expect(defaultMinNumberOfCopies(newBi({ minNumberOfCopies: 2 }), 5).spec!.minNumberOfCopies).toBe(2);
    expect(defaultDataEngine(newBi({})).spec!.dataEngine).toBe('v1');
    expect(defaultDataEngine(newBi({ dataEngine: 'v2' })).spec!.dataEngine).toBe('v2');
    expect(defaultDiskMaps(newBi({ disks: { a: '' } })).spec).toEqual({ disks: { a: '' }, diskFileSpecMap: {} });
  });

  it('the finalizer is not added to an object being deleted, nor twice', () => {
    const deleting = newBi({});
    deleting.metadata.deletionTimestamp = '2026-11-22T10:00:00Z';
    expect(withFinalizer(deleting).metadata.finalizers).toBeUndefined();
    const once = withFinalizer(withFinalizer(newBi({})));
    expect(once.metadata.finalizers).toEqual(['longhorn.io']);
  });
});

describe('update and other kinds', () => {
  it('BackingImage update: sourceType "" → download, nil maps → {}', () => {
    const bi = newBi({ sourceType: '' as 'download' });
    expect(applyBackingImageUpdateDefaults(bi).spec).toEqual({ sourceType: 'download', disks: {}, diskFileSpecMap: {}, sourceParameters: {} });
  });

  it('BIDS and BIM', () => {
    const bids: BackingImageDataSource = { apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImageDataSource', metadata: { name: 'a' }, spec: {} };
    expect(applyBackingImageDataSourceDefaults(bids)).toMatchObject({ metadata: { finalizers: ['longhorn.io'] }, spec: { sourceType: 'download', parameters: {} } });
    const bim: BackingImageManager = { apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImageManager', metadata: { name: 'b' } };
    expect(applyBackingImageManagerDefaults(bim)).toMatchObject({ metadata: { finalizers: ['longhorn.io'] }, spec: { backingImages: {} } });
  });

  it('BBI create: default target, fallback to default, labels; error without any target', () => {
    const bbi: BackupBackingImage = { apiVersion: 'longhorn.io/v1beta2', kind: 'BackupBackingImage', metadata: { name: 'img-1', labels: { x: 'y' } }, spec: { backingImage: 'img', userCreated: true } };
    const out = applyBackupBackingImageCreateDefaults(bbi, (n) => n === 'default');
    expect(out.spec!.backupTargetName).toBe('default');
    expect(out.metadata).toEqual({ name: 'img-1', finalizers: ['longhorn.io'], labels: { x: 'y', 'backup-target': 'default', 'backing-image': 'img' } });
    const named = { ...bbi, spec: { ...bbi.spec!, backupTargetName: 'gone' } };
    expect(applyBackupBackingImageCreateDefaults(named, (n) => n === 'default').spec!.backupTargetName).toBe('default');
    const kept = { ...bbi, spec: { ...bbi.spec!, backupTargetName: 'remote' } };
    expect(applyBackupBackingImageCreateDefaults(kept, () => true).metadata.labels!['backup-target']).toBe('remote');
    expect(() => applyBackupBackingImageCreateDefaults(named, () => false)).toThrow('backup target default not found');
    expect(applyBackupBackingImageUpdateDefaults(bbi).metadata.finalizers).toEqual(['longhorn.io']);
  });
});
