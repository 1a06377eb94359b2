import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { CoreV1Api } from '@kubernetes/client-node';
import { runDatastoreContract, CONTRACT_KINDS, WidgetKind, type ContractHarness, type Widget } from '@bis/datastore/testing';
import { FOREGROUND_FINALIZER, type ResourceKind } from '@bis/datastore';
import { ApiAccess, API_RESOURCE_USES, DATASTORE_STATUS_VERBS, DATASTORE_VERBS } from './api-access.js';
import { KubeDatastore } from './kube-datastore.js';
import { ControlPlane, envtestAssets, installCrds } from './testing/envtest.js';

/**
 * The datastore contract against a real kube-apiserver + etcd (envtest). Needs KUBEBUILDER_ASSETS; skipped otherwise.
 * One control plane for the file; each contract test gets a clean slate (objects of the contract kinds removed).
 */
const assets = envtestAssets();
if (!assets.dir) console.warn(`kube-datastore.envtest.spec.ts skipped: ${assets.reason}`);
const describeEnv = assets.dir ? describe : describe.skip;

const contractAccess = new ApiAccess([
  ...API_RESOURCE_USES,
  ...CONTRACT_KINDS.flatMap((k) => [
    { group: 'contract.bis.dev', version: 'v1', resource: k.plural, verbs: DATASTORE_VERBS, usedBy: 'contract test' },
    { group: 'contract.bis.dev', version: 'v1', resource: `${k.plural}/status`, verbs: DATASTORE_STATUS_VERBS, usedBy: 'contract test' },
  ]),
]);

function crdFor(kind: ResourceKind): Record<string, unknown> {
  const [group, version] = kind.apiVersion.split('/');
  const schema = kind.statusSubresource === false
    ? { type: 'object', 'x-kubernetes-preserve-unknown-fields': true }
    : {
        type: 'object',
        properties: {
          spec: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
          status: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true },
        },
      };
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { name: `${kind.plural}.${group}` },
    spec: {
      group,
      scope: kind.namespaced ? 'Namespaced' : 'Cluster',
      names: { plural: kind.plural, singular: kind.kind.toLowerCase(), kind: kind.kind, listKind: `${kind.kind}List` },
      versions: [{ name: version, served: true, storage: true, schema: { openAPIV3Schema: schema }, ...(kind.statusSubresource === false ? {} : { subresources: { status: {} } }) }],
    },
  };
}

/** Removes every object of the contract kinds (finalizers first), and waits until they are gone. */
async function wipe(ds: KubeDatastore): Promise<void> {
  for (const kind of CONTRACT_KINDS as readonly ResourceKind[]) {
    for (let round = 0; ; round++) {
      const { items } = await ds.list(kind);
      if (!items.length) break;
      if (round > 100) throw new Error(`cannot clean up ${kind.plural}: ${items.map((i) => i.metadata.name).join(', ')}`);
      for (const o of items) {
        try {
          if (o.metadata.finalizers?.length) await ds.update(kind, { ...o, metadata: { ...o.metadata, finalizers: [] } });
          if (!o.metadata.deletionTimestamp) await ds.delete(kind, o.metadata.name, o.metadata.namespace);
        } catch {
          // changed or gone meanwhile: the next round sees it again
        }
      }
    }
  }
}

describeEnv('KubeDatastore against a real API server (envtest)', () => {
  let cp: ControlPlane;
  let admin: KubeDatastore;
  let compactor: NodeJS.Timeout | undefined;
  let historyLimit = 0;
  let compacting = Promise.resolve();

  beforeAll(async () => {
    // No watch cache: watches read etcd, so etcd's compaction decides what is too old (410), as the contract's
    // history limit asks. (With the cache, the cache window decides; it grows with traffic.)
    cp = await ControlPlane.start({ apiServerArgs: ['--watch-cache=false'] });
    const kc = cp.kubeConfig();
    await installCrds(cp, CONTRACT_KINDS.map((k) => crdFor(k as ResourceKind)));
    const core = kc.makeApiClient(CoreV1Api);
    for (const name of ['contract', 'elsewhere']) await core.createNamespace({ body: { metadata: { name } } });
    admin = new KubeDatastore({ kubeConfig: kc, access: contractAccess });
    // Keep about `historyLimit` revisions of etcd history, like the embedded store's history limit.
    compactor = setInterval(() => {
      compacting = compacting.then(async () => {
        if (!historyLimit) return;
        const rev = await cp.etcdRevision();
        if (rev > historyLimit) await cp.compact(rev - historyLimit);
      }).catch(() => undefined);
    }, 100);
  }, 180_000);

  afterAll(async () => {
    if (compactor) clearInterval(compactor);
    await compacting;
    await admin?.close();
    await cp?.stop();
  }, 60_000);

  runDatastoreContract(
    'kubernetes (client-node against kube-apiserver v1.20 + etcd)',
    async (opts): Promise<ContractHarness> => {
      historyLimit = opts.historyLimit;
      const open = (): KubeDatastore => new KubeDatastore({ kubeConfig: cp.kubeConfig(), access: contractAccess });
      let store = open();
      const h: ContractHarness = {
        store,
        async reopen() {
          await store.close();
          store = open();
          h.store = store;
          return store;
        },
        async dispose() {
          await store.close();
          await wipe(admin);
        },
      };
      return h;
    },
    { noGarbageCollector: 'an API server alone runs no garbage collector (kube-controller-manager); envtest has none' },
  );

  describe('what the API server itself does on deletion with dependents (the garbage collector does the rest)', () => {
    it('Foreground and Orphan deletes leave the owner with a deletionTimestamp and the GC finalizer', async () => {
      const ns = 'contract';
      const w = (name: string): Widget => ({ apiVersion: WidgetKind.apiVersion, kind: 'Widget', metadata: { name, namespace: ns }, spec: { size: 1 } });
      await admin.create(WidgetKind, w('fg'));
      await admin.create(WidgetKind, w('or'));
      const fg = await admin.delete(WidgetKind, 'fg', ns, { propagationPolicy: 'Foreground' });
      expect(fg.metadata.deletionTimestamp).toBeTruthy();
      expect(fg.metadata.finalizers).toContain(FOREGROUND_FINALIZER);
      const or = await admin.delete(WidgetKind, 'or', ns, { propagationPolicy: 'Orphan' });
      expect(or.metadata.deletionTimestamp).toBeTruthy();
      expect(or.metadata.finalizers).toContain('orphan');
      await wipe(admin);
    });
  });
});
