import { afterEach, describe, expect, it } from '@jest/globals';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { LONGHORN_API_VERSION } from '@bis/crd-types';
import { EmbeddedDatastore } from '@bis/datastore';
import { BackingImageKind, BackupBackingImageKind, BackupTargetKind } from './kinds.js';
import { backupTargetCredential, DatastoreSecretStore, encodeSecretData, redactSecrets, SecretKind, SecretNotFoundError } from './secrets.js';
import { NS, startHarness, waitFor, type Harness } from './test-support/harness.js';

const KEY_ID = 'AKIAEXAMPLEKEYID0001';
const SECRET_KEY = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY';
const VALUES = { AWS_ACCESS_KEY_ID: KEY_ID, AWS_SECRET_ACCESS_KEY: SECRET_KEY, AWS_ENDPOINTS: 'https://127.0.0.1:9000', EXTRA: 'not-a-longhorn-key' };

describe('redactSecrets', () => {
  it('replaces every occurrence of every value with ***', () => {
    const text = `denied for ${KEY_ID} (signed with ${SECRET_KEY}); again: ${KEY_ID}`;
    const out = redactSecrets(text, { AWS_ACCESS_KEY_ID: KEY_ID, AWS_SECRET_ACCESS_KEY: SECRET_KEY });
    expect(out).toBe('denied for *** (signed with ***); again: ***');
  });

  it('leaves values shorter than 4 characters (they would blank ordinary words) and a text without values as they are', () => {
    expect(redactSecrets('true is on, abc too', { VIRTUAL_HOSTED_STYLE: 'true'.slice(0, 3), X: 'abc' })).toBe('true is on, abc too');
    expect(redactSecrets('value true', { VIRTUAL_HOSTED_STYLE: 'true' })).toBe('value ***');
    expect(redactSecrets('nothing secret here', {})).toBe('nothing secret here');
    expect(redactSecrets('nothing secret here', { AWS_ACCESS_KEY_ID: KEY_ID })).toBe('nothing secret here');
  });
});

describe('backupTargetCredential over the embedded store', () => {
  let dir: string;
  let store: EmbeddedDatastore;
  afterEach(async () => {
    await store?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });
  const open = async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'bis-secrets-'));
    store = await EmbeddedDatastore.open({ dataDir: dir });
    await store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 's3-secret', namespace: NS }, data: encodeSecretData(VALUES) });
    return new DatastoreSecretStore(store, NS);
  };

  it('is empty for a target without a credential secret', async () => {
    const secrets = await open();
    expect(await backupTargetCredential(secrets, undefined)).toEqual({});
    expect(await backupTargetCredential(secrets, { spec: { backupTargetURL: 's3://b@r/', credentialSecret: '', pollInterval: '5m0s' } })).toEqual({});
  });

  it("passes Longhorn's keys of the named secret, decoded, and drops other keys", async () => {
    const secrets = await open();
    const cred = await backupTargetCredential(secrets, { spec: { backupTargetURL: 's3://b@r/', credentialSecret: 's3-secret', pollInterval: '5m0s' } });
    expect(cred).toEqual({ AWS_ACCESS_KEY_ID: KEY_ID, AWS_SECRET_ACCESS_KEY: SECRET_KEY, AWS_ENDPOINTS: 'https://127.0.0.1:9000' });
  });

  it('a missing secret is an error naming the secret and its namespace', async () => {
    const secrets = await open();
    const p = backupTargetCredential(secrets, { spec: { backupTargetURL: 's3://b@r/', credentialSecret: 'nope', pollInterval: '5m0s' } });
    await expect(p).rejects.toBeInstanceOf(SecretNotFoundError);
    await expect(p).rejects.toThrow(`secret nope not found in namespace ${NS}`);
  });
});

describe('secret values never reach a status, an event or a log line', () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });
  const leaks = (text: string) => text.includes(KEY_ID) || text.includes(SECRET_KEY);
  const echo = (what: string) => new Error(`${what}: S3 (HTTP 403): InvalidAccessKeyId for ${KEY_ID}, signature computed with ${SECRET_KEY}`);

  async function withTarget(): Promise<Harness> {
    const harness = await startHarness();
    await harness.store.create(SecretKind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 's3-secret', namespace: NS }, data: encodeSecretData(VALUES) });
    return harness;
  }

  it("the target's availability message (an error that echoes the credential) is redacted in its status and log", async () => {
    h = await withTarget();
    h.sim.backupTarget.listBackingImages = async () => {
      throw echo('list');
    };
    await h.store.create(BackupTargetKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupTarget', metadata: { name: 'default', namespace: NS }, spec: { backupTargetURL: 's3://lh@us-east-1/', credentialSecret: 's3-secret', pollInterval: '1s' } });
    const t = await waitFor('target unavailable with a message', async () => {
      const x = await h!.store.get(BackupTargetKind, 'default', NS);
      return x.status?.conditions?.[0]?.message ? x : undefined;
    });
    expect(t.status?.available).toBe(false);
    const message = t.status!.conditions![0]!.message;
    expect(message).toContain('S3 (HTTP 403): InvalidAccessKeyId for ***, signature computed with ***');
    expect(leaks(JSON.stringify(t))).toBe(false);
    expect(h.logs.some((l) => l.includes('InvalidAccessKeyId for ***'))).toBe(true);
    expect(h.logs.some(leaks)).toBe(false);
  });

  it("a backup whose manager reports an error that echoes the credential: the backup's status and events are redacted", async () => {
    h = await withTarget();
    const url = 'http://127.0.0.1:8080/img.raw';
    const sum = h.sim.serve(url, 'backup-me-'.repeat(100));
    await h.store.create(BackupTargetKind, { apiVersion: LONGHORN_API_VERSION, kind: 'BackupTarget', metadata: { name: 'default', namespace: NS }, spec: { backupTargetURL: 's3://lh@us-east-1/', credentialSecret: 's3-secret', pollInterval: '1s' } });
    await waitFor('backup target available', async () => (await h!.store.get(BackupTargetKind, 'default', NS)).status?.available);
    await h.cm.actions.create({ name: 'img', sourceType: 'download', parameters: { url }, expectedChecksum: sum, minNumberOfCopies: 1 });
    await waitFor('img ready', async () => Object.values((await h!.store.get(BackingImageKind, 'img', NS)).status?.diskFileStatusMap ?? {}).some((s) => s.state === 'ready'));
    const managerClient = h.sim.managerClient.bind(h.sim);
    let sentCredential: Record<string, string> | undefined;
    h.sim.managerClient = (address) => {
      const c = managerClient(address);
      return {
        ...c,
        backupCreate: async (req) => {
          sentCredential = req.credential;
        },
        backupStatus: async () => ({ progress: 0, backupUrl: '', state: 'error', error: echo('upload block').message }),
      };
    };
    const bbi = await h.cm.actions.createBackup('img');
    const failed = await waitFor('backup in Error', async () => {
      const b = await h!.store.get(BackupBackingImageKind, bbi.metadata.name, NS);
      return b.status?.state === 'Error' ? b : undefined;
    });
    // the manager was given the credential, as Longhorn passes it
    expect(sentCredential).toMatchObject({ AWS_ACCESS_KEY_ID: KEY_ID, AWS_SECRET_ACCESS_KEY: SECRET_KEY });
    expect(failed.status?.error).toContain('upload block: S3 (HTTP 403): InvalidAccessKeyId for ***');
    expect(leaks(JSON.stringify(failed))).toBe(false);
    const events = await h.cm.events.list({ name: 'img' });
    expect(events.some((e) => e.message.includes('InvalidAccessKeyId for ***'))).toBe(true);
    expect(events.some((e) => leaks(e.message))).toBe(false);
    expect(h.logs.some(leaks)).toBe(false);
  });
});
