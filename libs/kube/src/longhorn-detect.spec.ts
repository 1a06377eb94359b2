import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { ApiAccess, API_RESOURCE_USES } from './api-access.js';
import { kubeConfigFor } from './kube-datastore.js';
import { LonghornDetectedError, assertNoLonghorn, findLonghornManagers } from './longhorn-detect.js';
import { KubeApiDouble } from './testing/kube-api-double.js';
import { TestDaemonSetKind, type TestDaemonSet } from './testing/kinds.js';

const daemonSet = (namespace: string, name: string, labels: Record<string, string>): TestDaemonSet => ({
  apiVersion: 'apps/v1',
  kind: 'DaemonSet',
  metadata: { name, namespace, labels },
  spec: {},
});

describe('Longhorn detection (the daemon refuses to run beside Longhorn)', () => {
  let api: KubeApiDouble;
  beforeEach(async () => {
    api = await KubeApiDouble.start({ kinds: [TestDaemonSetKind] });
  });
  afterEach(async () => {
    await api.stop();
  });

  it("finds Longhorn's manager DaemonSet in any namespace, and nothing else", async () => {
    const kc = kubeConfigFor(api.url, api.token);
    // This system's own DaemonSet and an unrelated one are not Longhorn.
    await api.store.create(TestDaemonSetKind, daemonSet('bis-system', 'backing-image-system-manager', { app: 'backing-image-system-manager' }));
    await api.store.create(TestDaemonSetKind, daemonSet('kube-system', 'kube-proxy', { 'k8s-app': 'kube-proxy' }));
    expect(await findLonghornManagers(kc)).toEqual([]);
    await expect(assertNoLonghorn(kc)).resolves.toBeUndefined();

    await api.store.create(TestDaemonSetKind, daemonSet('longhorn-system', 'longhorn-manager', { app: 'longhorn-manager' }));
    expect(await findLonghornManagers(kc)).toEqual([{ namespace: 'longhorn-system', name: 'longhorn-manager' }]);
    const err = await assertNoLonghorn(kc).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LonghornDetectedError);
    expect((err as Error).message).toContain('Longhorn is installed in this cluster (DaemonSet longhorn-system/longhorn-manager labelled app=longhorn-manager)');
    expect((err as Error).message).toContain('must not run beside them');

    // One cluster-wide list, granted by the RBAC table (the chart's ClusterRole).
    const lists = api.calls.filter((c) => c.resource === 'daemonsets');
    expect(lists.every((c) => c.verb === 'list' && c.group === 'apps')).toBe(true);
    const access = new ApiAccess(API_RESOURCE_USES);
    expect(api.calls.filter((c) => !access.allows(c.group, c.resource, c.verb))).toEqual([]);
    expect(API_RESOURCE_USES.find((u) => u.resource === 'daemonsets')?.scope).toBe('cluster');
  });

  it('a refused list is an error that says what the check needs (never a silent pass)', async () => {
    const kc = kubeConfigFor(api.url, 'not-the-token');
    await expect(findLonghornManagers(kc)).rejects.toThrow(/list daemonsets\.apps in all namespaces \(to check that Longhorn is not installed/);
  });
});
