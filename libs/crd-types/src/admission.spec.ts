import { describe, expect, it } from '@jest/globals';
import { isLoopbackHost, validateBackingImageCreate, validateBackingImageStatusUpdate, validateBackingImageUpdate, validateBackupBackingImageCreate, validateDownloadUrl } from './admission.js';
import { type BackingImage } from './kinds/index.js';
import { type ValidationIssue } from './schema/errors.js';
import { fullBackingImage, fullBackupBackingImage, fullBackupTarget } from './test-support/fixtures.js';

function bi(spec: Partial<NonNullable<BackingImage['spec']>>, name = 'img-1'): BackingImage {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackingImage',
    metadata: { name },
    spec: { sourceType: 'upload', minNumberOfCopies: 1, dataEngine: 'v1', disks: {}, diskFileSpecMap: {}, sourceParameters: {}, ...spec },
  };
}
const messages = (issues: ValidationIssue[]) => issues.map((i) => i.message);
const rules = (issues: ValidationIssue[]) => issues.map((i) => `${i.path} ${i.rule}`);

describe('BackingImage create', () => {
  it('accepts a valid object of every source type', () => {
    expect(validateBackingImageCreate(fullBackingImage())).toEqual([]);
    expect(validateBackingImageCreate(bi({ sourceType: 'upload' }))).toEqual([]);
    expect(validateBackingImageCreate(bi({ sourceType: 'export-from-volume', sourceParameters: { 'volume-name': 'v', 'export-type': 'qcow2' } }))).toEqual([]);
    expect(validateBackingImageCreate(bi({ sourceType: 'restore', sourceParameters: { 'backup-url': 's3://b@r/?backingImage=x' } }))).toEqual([]);
    expect(validateBackingImageCreate(bi({ sourceType: 'clone', sourceParameters: { 'backing-image': 'src', encryption: 'ignore' } }))).toEqual([]);
  });

  it('rejects v2 with Longhorn\'s message', () => {
    expect(messages(validateBackingImageCreate(bi({ dataEngine: 'v2' })))).toEqual(['spec.dataEngine: v2 backing image is not supported']);
  });

  it('name rules', () => {
    expect(messages(validateBackingImageCreate(bi({}, 'a')))).toEqual(['metadata.name: invalid name a: must match ^[a-z0-9][a-z0-9_.-]+$']);
    expect(rules(validateBackingImageCreate(bi({}, '-abc')))).toEqual(['metadata.name name']);
    expect(rules(validateBackingImageCreate(bi({}, 'Upper')))).toEqual(['metadata.name name']);
    expect(rules(validateBackingImageCreate(bi({}, 'has_underscore')))).toEqual(['metadata.name name']);
    expect(rules(validateBackingImageCreate(bi({}, '')))).toEqual(['metadata.name required']);
    expect(validateBackingImageCreate(bi({}, 'ubuntu-24.04'))).toEqual([]);
  });

  it('checksum format', () => {
    expect(validateBackingImageCreate(bi({ checksum: '' }))).toEqual([]);
    expect(validateBackingImageCreate(bi({ checksum: 'a'.repeat(128) }))).toEqual([]);
    expect(validateBackingImageCreate(bi({ checksum: `sha256:${'a'.repeat(64)}` }))).toEqual([]);
    expect(messages(validateBackingImageCreate(bi({ checksum: 'a'.repeat(64) })))).toEqual([
      `spec.checksum: invalid checksum ${'a'.repeat(64)}: sha512 checksum must be 128 hex characters (got 64)`,
    ]);
    expect(rules(validateBackingImageCreate(bi({ checksum: `md5:${'a'.repeat(40)}` })))).toEqual(['spec.checksum checksum']);
  });

  it('minNumberOfCopies >= 1 with Longhorn\'s message', () => {
    expect(messages(validateBackingImageCreate(bi({ minNumberOfCopies: 0 })))).toEqual([
      'spec.minNumberOfCopies: minimum number of backing image copies 0 must larger than 0',
    ]);
    expect(rules(validateBackingImageCreate(bi({ minNumberOfCopies: -2 })))).toEqual(['spec.minNumberOfCopies minimum']);
  });

  it('source type is required and must be known (schema check)', () => {
    const noType = bi({});
    delete noType.spec!.sourceType;
    expect(rules(validateBackingImageCreate(noType))).toEqual(['spec.sourceType required']);
    expect(rules(validateBackingImageCreate(bi({ sourceType: 'ftp' as 'upload' })))).toEqual(['spec.sourceType enum']);
  });

  it('download URL rules', () => {
    const dl = (url?: string) => bi({ sourceType: 'download', sourceParameters: url === undefined ? {} : { url } });
    // Longhorn's messages (webhook/resources/backingimage/validator.go), Go's url.ParseRequestURI errors included.
    expect(messages(validateBackingImageCreate(dl()))).toEqual(['spec.sourceParameters[url]: download URL is not provided']);
    expect(messages(validateBackingImageCreate(dl('not a url')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "not a url": invalid URI for request']);
    expect(messages(validateBackingImageCreate(dl('x')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "x": invalid URI for request']);
    expect(messages(validateBackingImageCreate(dl('://h/x')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "://h/x": missing protocol scheme']);
    expect(messages(validateBackingImageCreate(dl('http://h:port/x')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "http://h:port/x": invalid port ":port" after host']);
    expect(messages(validateBackingImageCreate(dl('http://h/%zz')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "http://h/%zz": invalid URL escape "%zz"']);
    expect(messages(validateBackingImageCreate(dl('http://a b/x')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "http://a b/x": invalid character " " in host name']);
    expect(messages(validateBackingImageCreate(dl('http://h/a\nb')))).toEqual(['spec.sourceParameters[url]: invalid download URL: parse "http://h/a\\nb": net/url: invalid control character in URL']);
    expect(messages(validateBackingImageCreate(dl('/x.img')))).toEqual(['spec.sourceParameters[url]: invalid download URL scheme "" (must use scheme http or https)']);
    expect(messages(validateBackingImageCreate(dl('ftp://example.com/a.img')))).toEqual(['spec.sourceParameters[url]: invalid download URL scheme "ftp" (must use scheme http or https)']);
    expect(messages(validateBackingImageCreate(dl('HTTP://example.com/a.img')))).toEqual([]);
    expect(messages(validateBackingImageCreate(dl('http://127.0.0.1:8080/a.img')))).toEqual([
      'spec.sourceParameters[url]: download URL must not target a loopback address (got "127.0.0.1")',
    ]);
    // An empty host: WHATWG would read `http:///x.img` as host x.img; Go (and so Longhorn) reads no host.
    for (const url of ['http:///x.img', 'http:x.img', 'http://:80/x']) {
      expect(messages(validateBackingImageCreate(dl(url)))).toEqual(['spec.sourceParameters[url]: download URL must not target a loopback address (the URL has no host)']);
    }
    for (const url of ['http://localhost/a', 'http://[::1]/a', 'http://0.0.0.0/a', 'http://127.1.2.3/a', 'http://LOCALHOST./a', 'http://[::ffff:127.0.0.1]/a', 'http://2130706433/a']) {
      expect(rules(validateBackingImageCreate(dl(url)))).toEqual(['spec.sourceParameters[url] url']);
    }
    expect(validateBackingImageCreate(dl('https://images.example.com/a.qcow2'))).toEqual([]);
    expect(validateBackingImageCreate(dl('http://10.0.0.1/a.img'))).toEqual([]);
  });

  it('the loopback rule is a policy with an allowlist', () => {
    const dl = bi({ sourceType: 'download', sourceParameters: { url: 'http://127.0.0.1:8080/a.img' } });
    expect(validateBackingImageCreate(dl, { downloadUrlPolicy: { rejectLoopback: false } })).toEqual([]);
    expect(validateBackingImageCreate(dl, { downloadUrlPolicy: { allowedHosts: ['127.0.0.1:8080'] } })).toEqual([]);
    expect(validateBackingImageCreate(dl, { downloadUrlPolicy: { allowedHosts: ['127.0.0.1'] } })).toEqual([]);
    expect(validateBackingImageCreate(dl, { downloadUrlPolicy: { allowedHosts: ['127.0.0.1:9999'] } })).toHaveLength(1);
    expect(validateDownloadUrl('u', 'http://localhost/x', { allowedHosts: ['localhost'] })).toEqual([]);
    // The data sources' --allow-source-hosts rule, applied at admission through refuseHost (any kind of address).
    const refuseHost = (h: string) => (h.startsWith('10.') || h === '169.254.169.254' ? `${h} is private` : undefined);
    expect(messages(validateDownloadUrl('u', 'http://10.0.0.5/x', { refuseHost }))).toEqual(['u: download URL is not an allowed source host: 10.0.0.5 is private']);
    expect(messages(validateDownloadUrl('u', 'http://169.254.169.254/x', { refuseHost }))).toEqual(['u: download URL is not an allowed source host: 169.254.169.254 is private']);
    expect(validateDownloadUrl('u', 'http://10.0.0.5/x', { refuseHost, allowedHosts: ['10.0.0.5'] })).toEqual([]);
    expect(validateDownloadUrl('u', 'https://images.example.com/x', { refuseHost })).toEqual([]);
    expect(isLoopbackHost('example.com')).toBe(false);
    expect(isLoopbackHost('')).toBe(true);
  });

  it('export-from-volume parameters', () => {
    const out = validateBackingImageCreate(bi({ sourceType: 'export-from-volume', sourceParameters: { 'export-type': 'vmdk' } }));
    expect(messages(out)).toEqual([
      'spec.sourceParameters[volume-name]: is required for source type export-from-volume',
      'spec.sourceParameters[export-type]: must be one of raw, qcow2 (got "vmdk")',
    ]);
  });

  it('export-from-volume: the volume must exist, be v1 and not faulted when volumes can be looked up', () => {
    const create = (volumeName: string, getVolume: (n: string) => { dataEngine: string; faulted: boolean } | undefined) =>
      messages(validateBackingImageCreate(bi({ sourceType: 'export-from-volume', sourceParameters: { 'volume-name': volumeName, 'export-type': 'raw' } }), { getVolume }));
    const volumes: Record<string, { dataEngine: string; faulted: boolean }> = {
      good: { dataEngine: 'v1', faulted: false },
      fast: { dataEngine: 'v2', faulted: false },
      broken: { dataEngine: 'v1', faulted: true },
    };
    const lookup = (n: string) => volumes[n];
    expect(create('good', lookup)).toEqual([]);
    expect(create('gone', lookup)).toEqual(['spec.sourceParameters[volume-name]: volume gone not found: there is no volume to export from']);
    expect(create('fast', lookup)).toEqual(['spec.sourceParameters[volume-name]: volume fast is a v2 volume: exporting a backing image from it is not supported']);
    expect(create('broken', lookup)).toEqual(['spec.sourceParameters[volume-name]: volume broken is faulted: cannot export a backing image from it']);
    // A system without volumes refuses every export instead of accepting one that can never start.
    expect(create('good', () => undefined)).toEqual(['spec.sourceParameters[volume-name]: volume good not found: there is no volume to export from']);
  });

  it('restore needs a backup URL', () => {
    expect(rules(validateBackingImageCreate(bi({ sourceType: 'restore', sourceParameters: {} })))).toEqual(['spec.sourceParameters[backup-url] required']);
  });

  it('clone parameters, source lookups and encryption direction', () => {
    expect(rules(validateBackingImageCreate(bi({ sourceType: 'clone', sourceParameters: { encryption: 'rot13' } })))).toEqual([
      'spec.sourceParameters[backing-image] required',
      'spec.sourceParameters[encryption] enum',
    ]);
    expect(messages(validateBackingImageCreate(bi({ sourceType: 'clone', sourceParameters: { 'backing-image': 'src', encryption: 'encrypt' } })))).toEqual([
      'spec.sourceParameters[secret]: secret is not provided for encryption or decryption during cloneing (secret and secret-namespace required to encrypt a clone)',
    ]);
    const plain = fullBackingImage();
    const encrypted = fullBackingImage();
    encrypted.spec!.secret = 's';
    encrypted.spec!.secretNamespace = 'ns';
    const v2 = fullBackingImage();
    v2.spec!.dataEngine = 'v2';
    const images: Record<string, BackingImage> = { plain, encrypted, v2 };
    const ctx = { getBackingImage: (n: string) => images[n], secretExists: (ns: string, n: string) => ns === 'ns' && n === 's' };
    const clone = (source: string, encryption: string, secret = 's') =>
      validateBackingImageCreate(bi({ sourceType: 'clone', sourceParameters: { 'backing-image': source, encryption, secret, 'secret-namespace': 'ns' } }), ctx);
    expect(clone('plain', 'encrypt')).toEqual([]);
    expect(clone('encrypted', 'decrypt')).toEqual([]);
    expect(messages(clone('encrypted', 'encrypt'))).toEqual(['spec.sourceParameters[encryption]: source backing image encrypted is already encrypted']);
    expect(messages(clone('plain', 'decrypt'))).toEqual(['spec.sourceParameters[encryption]: source backing image plain is not encrypted']);
    expect(rules(clone('v2', 'ignore'))).toEqual(['spec.sourceParameters[backing-image] unsupported']);
    expect(messages(clone('missing', 'ignore'))).toEqual(['spec.sourceParameters[backing-image]: source backing image missing not found']);
    expect(messages(clone('plain', 'encrypt', 'other'))).toEqual(['spec.sourceParameters[secret]: secret ns/other not found']);
  });

  it('the encryption secret must be complete and exist', () => {
    expect(rules(validateBackingImageCreate(bi({ secret: 's' })))).toEqual(['spec.secretNamespace required']);
    expect(messages(validateBackingImageCreate(bi({ secret: 's', secretNamespace: 'ns' }), { secretExists: () => false }))).toEqual([
      'spec.secret: secret ns/s not found',
    ]);
    expect(validateBackingImageCreate(bi({ secret: 's', secretNamespace: 'ns' }), { secretExists: () => true })).toEqual([]);
  });

  it('collects every issue at once', () => {
    const out = validateBackingImageCreate(bi({ dataEngine: 'v2', checksum: 'x', minNumberOfCopies: 0, sourceType: 'download' }, 'A'));
    expect(rules(out)).toEqual([
      'metadata.name name',
      'spec.dataEngine unsupported',
      'spec.checksum checksum',
      'spec.minNumberOfCopies minimum',
      'spec.sourceParameters[url] required',
    ]);
  });
});

describe('BackingImage update', () => {
  const base = () => bi({ sourceType: 'download', sourceParameters: { url: 'http://example.com/a.img' }, secret: 's', secretNamespace: 'ns', checksum: 'a'.repeat(128) });

  it('allows changing minNumberOfCopies, selectors and the disk map', () => {
    const next = base();
    next.spec!.minNumberOfCopies = 4;
    next.spec!.diskFileSpecMap = { d: { dataEngine: 'v1' } };
    next.spec!.nodeSelector = ['x'];
    expect(validateBackingImageUpdate(base(), next)).toEqual([]);
  });

  it('rejects changing secret or data engine with Longhorn\'s messages', () => {
    const next = base();
    next.spec!.secret = 'other';
    expect(messages(validateBackingImageUpdate(base(), next))).toEqual(['spec.secret: changing secret for BackingImage img-1 is not supported']);
    const ns = base();
    ns.spec!.secretNamespace = 'other';
    expect(rules(validateBackingImageUpdate(base(), ns))).toEqual(['spec.secretNamespace immutable']);
    const engine = base();
    engine.spec!.dataEngine = 'v2';
    expect(messages(validateBackingImageUpdate(base(), engine))).toEqual(['spec.dataEngine: changing data engine for BackingImage img-1 is not supported']);
  });

  it('allows setting a secret that was empty and "" → v1 data engine', () => {
    const old = base();
    old.spec!.secret = '';
    old.spec!.secretNamespace = '';
    old.spec!.dataEngine = '' as 'v1';
    expect(validateBackingImageUpdate(old, base())).toEqual([]);
  });

  it('keeps source type, parameters and checksum immutable, accepting the mutator\'s normalisations', () => {
    const t = base();
    t.spec!.sourceType = 'upload';
    t.spec!.sourceParameters = {};
    const issues = validateBackingImageUpdate(base(), t);
    expect(rules(issues)).toEqual(['spec.sourceType immutable', 'spec.sourceParameters immutable']);
    const c = base();
    c.spec!.checksum = 'b'.repeat(128);
    expect(messages(validateBackingImageUpdate(base(), c))).toEqual(['spec.checksum: changing checksum for BackingImage img-1 is not supported']);
    const legacyOld = bi({ sourceType: '' as 'upload' });
    delete legacyOld.spec!.sourceParameters;
    const legacyNew = bi({ sourceType: 'download', sourceParameters: {} });
    // "" → download is allowed, but a download still needs its URL
    expect(rules(validateBackingImageUpdate(legacyOld, legacyNew))).toEqual(['spec.sourceParameters[url] required']);
  });

  it('re-checks the download URL and minNumberOfCopies', () => {
    const old = bi({ sourceType: 'download', sourceParameters: { url: 'http://localhost/a' } });
    const next = bi({ sourceType: 'download', sourceParameters: { url: 'http://localhost/a' }, minNumberOfCopies: 0 });
    expect(rules(validateBackingImageUpdate(old, next))).toEqual(['spec.minNumberOfCopies minimum', 'spec.sourceParameters[url] url']);
  });

  it('status uuid and checksum are set once', () => {
    const old = fullBackingImage();
    const next = fullBackingImage();
    expect(validateBackingImageStatusUpdate(old, next)).toEqual([]);
    next.status!.uuid = 'ffffffff';
    next.status!.checksum = '';
    expect(rules(validateBackingImageStatusUpdate(old, next))).toEqual(['status.uuid immutable', 'status.checksum immutable']);
    const fresh = fullBackingImage();
    fresh.status!.uuid = '';
    expect(validateBackingImageStatusUpdate(fresh, fullBackingImage())).toEqual([]);
  });
});

describe('BackupBackingImage create', () => {
  const bbi = () => {
    const b = fullBackupBackingImage();
    b.metadata.labels = { 'backup-target': 'default', 'backing-image': 'ubuntu-2404' };
    return b;
  };

  it('accepts a BBI whose target is available', () => {
    expect(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [], backupTarget: fullBackupTarget(), backingImage: fullBackingImage() })).toEqual([]);
  });

  it('rejects a duplicate for the same image and target', () => {
    const other = bbi();
    other.metadata.name = 'ubuntu-2404-ffffffff';
    expect(messages(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [other, bbi()], backupTarget: fullBackupTarget() }))).toEqual([
      'spec.backingImage: backup backing image ubuntu-2404 for backup target default already exists',
    ]);
    other.spec!.backupTargetName = 'remote';
    expect(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [other], backupTarget: fullBackupTarget() })).toEqual([]);
  });

  it('rejects a missing, URL-less or unavailable target, with the target\'s own message', () => {
    const msg = (why: string) => [`metadata.labels[backup-target]: backup target default is not available: ${why}`];
    expect(messages(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [] }))).toEqual(msg('it does not exist'));
    const noUrl = fullBackupTarget();
    noUrl.spec!.backupTargetURL = '';
    expect(messages(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [], backupTarget: noUrl }))).toEqual(msg('it has no URL'));
    const down = fullBackupTarget();
    down.status!.available = false;
    down.status!.conditions = [{ type: 'Unavailable', status: 'True', reason: 'Unavailable', message: 'S3 (HTTP 403): The AWS Access Key Id you provided does not exist', lastProbeTime: '', lastTransitionTime: '' }];
    expect(messages(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [], backupTarget: down }))).toEqual(
      msg('S3 (HTTP 403): The AWS Access Key Id you provided does not exist'),
    );
  });

  it('rejects backing up a v2 image and schema errors', () => {
    const v2 = fullBackingImage();
    v2.spec!.dataEngine = 'v2';
    expect(rules(validateBackupBackingImageCreate(bbi(), { otherBackupBackingImages: [], backupTarget: fullBackupTarget(), backingImage: v2 }))).toEqual([
      'spec.backingImage unsupported',
    ]);
    const broken = bbi() as unknown as { spec: Record<string, unknown> };
    delete broken.spec['userCreated'];
    expect(rules(validateBackupBackingImageCreate(broken as never, { otherBackupBackingImages: [], backupTarget: fullBackupTarget() }))).toEqual([
      'spec.userCreated required',
    ]);
  });
});
