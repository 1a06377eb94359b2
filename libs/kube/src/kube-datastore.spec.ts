import { runDatastoreContract, CONTRACT_KINDS, type ContractHarness } from '@bis/datastore/testing';
import { ApiAccess, API_RESOURCE_USES, DATASTORE_STATUS_VERBS, DATASTORE_VERBS } from './api-access.js';
import { KubeDatastore, kubeConfigFor } from './kube-datastore.js';
import { KubeApiDouble } from './test-support/kube-api-double.js';

/** The contract kinds are not part of the product, so the access table is extended for them here only. */
const contractAccess = new ApiAccess([
  ...API_RESOURCE_USES,
  ...CONTRACT_KINDS.flatMap((k) => [
    { group: 'contract.bis.dev', version: 'v1', resource: k.plural, verbs: DATASTORE_VERBS, usedBy: 'contract test' },
    { group: 'contract.bis.dev', version: 'v1', resource: `${k.plural}/status`, verbs: DATASTORE_STATUS_VERBS, usedBy: 'contract test' },
  ]),
]);

runDatastoreContract('kubernetes (client-node against the in-process API double)', async ({ historyLimit }): Promise<ContractHarness> => {
  const api = await KubeApiDouble.start({ kinds: CONTRACT_KINDS, historyLimit, bookmarkIntervalMs: 200 });
  const open = (): KubeDatastore => new KubeDatastore({ kubeConfig: kubeConfigFor(api.url, api.token), access: contractAccess });
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
      await api.stop();
    },
  };
  return h;
});
